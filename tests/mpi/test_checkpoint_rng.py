"""A resumed run that draws random numbers after the resume equals an uninterrupted one, bitwise.

Each step of the training loop below draws from Python's ``random``, numpy's global generator and
TensorFlow's global ``tf.random.Generator`` (the three states ``training_state`` saves), and the
draws change the data, so the weights depend on them as well as the logged draws. The run is
checkpointed half way; the "resumed process" then starts from other seeds and other weights (a
fresh process would) and restores the checkpoint. If any generator's state were not restored, the
draws after the resume, and so the final weights, would differ from the uninterrupted run's.

Every rank seeds the generators alike (as ``keras.utils.set_random_seed`` in a job does): a
checkpoint holds rank 0's state and restores it on every rank.
"""

from __future__ import annotations

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import CheckpointManager
from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state

pytestmark = pytest.mark.timeout(120)
STEPS, SAVE_AT = 8, 4


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_global_generator(tf.random.Generator.from_seed(seed))


def make(seed: int) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    opt.build(model.trainable_variables)
    return model, opt


def train(model, opt, steps: range, draws: list) -> None:
    """Steps whose data comes from all three global generators; every draw is logged."""
    rank = hc.rank()
    for _ in steps:
        shift = random.random()
        x = np.random.normal(size=(4, 3)).astype("float32") + np.float32(shift) + rank
        noise = tf.random.get_global_generator().normal([4, 1])
        draws.append((shift, x.tobytes(), noise.numpy().tobytes()))
        y = tf.reduce_sum(x, axis=1, keepdims=True) * 0.5 + noise
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


def test_resumed_draws_and_weights_equal_an_uninterrupted_run(world, shared_dir):
    hvd.init()
    seed_everything(11)
    straight, straight_opt = make(1)
    straight_draws: list = []
    train(straight, straight_opt, range(STEPS), straight_draws)

    seed_everything(11)
    first, first_opt = make(1)
    train(first, first_opt, range(SAVE_AT), [])
    manager = CheckpointManager(shared_dir, keep=2)
    manager.save({**training_state(first, first_opt), "input": {"next_step": SAVE_AT}},
                 step=SAVE_AT)

    seed_everything(99)  # a fresh process: other generator states, other weights
    resumed, resumed_opt = make(50)
    ckpt = manager.restore()
    assert ckpt is not None and int(ckpt.group("input")["next_step"]) == SAVE_AT
    assert {"python_internal", "numpy_keys", "tf_global_state"} <= set(ckpt.group("rng"))
    load_training_state(ckpt, resumed, resumed_opt)
    resumed_draws: list = []
    train(resumed, resumed_opt, range(SAVE_AT, STEPS), resumed_draws)

    assert len(resumed_draws) == len(straight_draws[SAVE_AT:]) == STEPS - SAVE_AT
    for k, (got, want) in enumerate(zip(resumed_draws, straight_draws[SAVE_AT:])):
        for source, a, b in zip(("random", "numpy", "tf.random"), got, want):
            assert a == b, f"step {SAVE_AT + k}: the {source} draw differs after the resume"
    weights, expected = resumed.get_weights(), straight.get_weights()
    assert len(weights) == len(expected) == 4
    for a, b in zip(weights, expected):
        np.testing.assert_array_equal(a, b)
