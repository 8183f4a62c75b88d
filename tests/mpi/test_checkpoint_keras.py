"""CheckpointCallback with model.fit on every rank: 2 epochs + resume + 1 epoch equals 3 epochs
straight, the restored state is identical on all ranks, and a signal saves and stops training."""

import os

import keras
import numpy as np
import pytest

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.tensorflow.checkpoint_callback import CheckpointCallback
from hpcrep.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback

B = 8


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def make_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse",
                  jit_compile=False)
    return model


def data(r):
    rng = np.random.default_rng(r)
    x = rng.normal(size=(4 * B, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")


def fit(model, r, epochs, initial_epoch=0, callbacks=()):
    x, y = data(r)
    model.fit(x, y, batch_size=B, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=[BroadcastGlobalVariablesCallback(0), *callbacks])


def test_resume_equals_uninterrupted(world, shared_dir):
    r, n = world
    straight = make_model(1)
    fit(straight, r, epochs=3)

    first = make_model(1)
    fit(first, r, epochs=2, callbacks=[CheckpointCallback(shared_dir)])
    resumed = make_model(50 + r)  # a fresh process would start from other weights
    cb = CheckpointCallback(shared_dir)
    assert cb.restore(resumed) == 2
    assert len(resumed.get_weights()) == len(first.get_weights()) == 4
    for a, b in zip(resumed.get_weights(), first.get_weights()):
        np.testing.assert_array_equal(a, b)
    opt_state = [np.asarray(v.numpy()) for v in resumed.optimizer.variables]
    gathered = hc.allgather_object(opt_state)
    assert gathered[0], "the restored optimizer has no variables"
    for other in gathered[1:]:
        assert len(other) == len(gathered[0])
        for a, b in zip(gathered[0], other):
            np.testing.assert_array_equal(a, b)
    fit(resumed, r, epochs=3, initial_epoch=2, callbacks=[cb])
    assert len(resumed.get_weights()) == len(straight.get_weights()) == 4
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert [s for s, _ in cb.manager.checkpoints()][-1] == 3 * 4


def test_signal_saves_and_stops(world, shared_dir):
    r, n = world
    model = make_model(2)

    class SendSignal(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and r == 0:
                os.kill(os.getpid(), cb.signum)

    cb = CheckpointCallback(shared_dir, requeue_on_signal=False)
    fit(model, r, epochs=5, callbacks=[SendSignal(), cb])
    assert cb.preempted
    ckpt = cb.manager.restore()
    # Rank 0 signalled after batch 1; all ranks agreed at the same batch (1 or, at most, 2).
    assert ckpt.attrs["preempted"] == 1 and ckpt.epoch == 0
    assert ckpt.attrs["batch"] in (2, 3) and ckpt.step == ckpt.attrs["batch"]
    assert int(model.optimizer.iterations.numpy()) == ckpt.step


def loss_scaled_model(seed):
    """Under mixed_float16, with a loss scale so large that every step of the first epochs
    overflows in float16 and is skipped: the optimizer's step counter stays at 0 meanwhile."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.LossScaleOptimizer(
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
        initial_scale=2.0 ** 60), "mse", jit_compile=False)
    return model


@pytest.mark.timeout(180)
def test_saves_of_skipped_steps_keep_their_own_names(world, shared_dir):
    """Steps a LossScaleOptimizer skips do not advance ``optimizer.iterations``: each save still
    gets its own, larger name, and a resume finds the newest."""
    r, n = world
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = loss_scaled_model(3)
        cb = CheckpointCallback(shared_dir, keep=5, signum=None)
        fit(model, r, epochs=2, callbacks=[cb])
        assert int(model.optimizer.iterations.numpy()) == 0  # every step skipped
        assert float(model.optimizer.dynamic_scale.numpy()) == 2.0 ** (60 - 8)
        saved = [s for s, _ in cb.manager.checkpoints()]
        assert saved == [4, 8], f"one file per save, named by steps run; got {saved}"
        assert cb.manager.restore().epoch == 2

        resumed = loss_scaled_model(50 + r)
        again = CheckpointCallback(shared_dir, keep=5, signum=None)
        assert again.restore(resumed) == 2
        fit(resumed, r, epochs=3, initial_epoch=2, callbacks=[again])
        fit(model, r, epochs=3, initial_epoch=2)  # the run that was never interrupted
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert [s for s, _ in again.manager.checkpoints()] == [4, 8, 12]
    newest = again.manager.restore()
    assert newest.epoch == 3 and newest.attrs["iterations"] == 0
    for a, b in zip(resumed.get_weights() + [v.numpy() for v in resumed.optimizer.variables],
                    model.get_weights() + [v.numpy() for v in model.optimizer.variables]):
        np.testing.assert_array_equal(a, b)
