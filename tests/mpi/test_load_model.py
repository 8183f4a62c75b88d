"""hvd.load_model: a saved Keras 3 model comes back with a distributed optimizer that
keeps the saved optimizer state, on every rank."""

import os

import keras
import numpy as np
import pytest

import hpcrep.comm as hc
import hpcrep.tensorflow.keras as hvdk
from hpcrep.tensorflow.optimizer import is_distributed

pytestmark = pytest.mark.timeout(180)

W0 = np.array([[0.5], [-1.0], [2.0]], np.float32)
B0 = np.array([0.25], np.float32)
M0 = [np.array([[0.1], [0.2], [-0.3]], np.float32), np.array([0.05], np.float32)]


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvdk.init()


def _data(r):
    rng = np.random.default_rng(40 + r)
    return (rng.standard_normal((4, 3)).astype(np.float32),
            rng.standard_normal((4, 1)).astype(np.float32))


def _save_on_rank_zero(path):
    """Rank 0 saves a compiled model whose DistributedOptimizer (SGD with momentum) has state."""
    if hc.rank() == 0:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.set_weights([W0, B0])
        model.compile(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), "mse")
        model.optimizer.build(model.trainable_variables)
        for slot, value in zip(model.optimizer.momentums, M0):
            slot.assign(value)
        model.optimizer.iterations.assign(5)
        model.save(path)
    hc.barrier()


def test_load_model_trains_with_averaged_gradients_and_the_saved_state(world, shared_dir):
    """One step after loading on every rank: momentum' = 0.9 m0 - 0.1 mean_r(g_r) and
    w' = w0 + momentum' (the closed form of Keras's SGD with the ranks' gradients averaged), the
    same bits on every rank, and the step counter continues from the saved 5."""
    r, n = world
    path = os.path.join(shared_dir, "model.keras")
    _save_on_rank_zero(path)
    model = hvdk.load_model(path)
    x, y = _data(r)
    model.train_on_batch(x, y)
    grads = []
    for k in range(n):
        xk, yk = (v.astype(np.float64) for v in _data(k))
        residual = xk @ W0.astype(np.float64) + B0 - yk
        grads.append([2.0 / len(xk) * xk.T @ residual, 2.0 / len(xk) * residual.sum(0)])
    for i, start in enumerate((W0, B0)):
        momentum = 0.9 * M0[i] - 0.1 * np.mean([g[i] for g in grads], axis=0)
        np.testing.assert_allclose(model.get_weights()[i], start + momentum, rtol=1e-5,
                                   atol=1e-6)
    everyone = hc.allgather_object([w.tobytes() for w in model.get_weights()])
    assert all(e == everyone[0] for e in everyone)
    assert is_distributed(model.optimizer)
    assert int(model.optimizer.iterations.numpy()) == 6


def test_load_model_passes_custom_objects_and_optimizers(shared_dir):
    """custom_optimizers (classes) and custom_objects reach Keras's loader; a model saved
    without an optimizer comes back as saved."""
    @keras.saving.register_keras_serializable(package="hpcrep_test")
    class HalfSGD(keras.optimizers.SGD):
        pass

    path = os.path.join(shared_dir, "custom.keras")
    bare = os.path.join(shared_dir, "bare.keras")
    if hc.rank() == 0:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(HalfSGD(0.5), "mse")
        model.save(path)
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(bare)
    hc.barrier()
    model = hvdk.load_model(path, custom_optimizers=[HalfSGD],
                            custom_objects={"unused": keras.layers.Dense})
    assert is_distributed(model.optimizer) and isinstance(model.optimizer, HalfSGD)
    assert model.optimizer.learning_rate.numpy() == np.float32(0.5)
    assert getattr(hvdk.load_model(bare), "optimizer", None) is None
