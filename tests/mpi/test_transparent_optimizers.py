"""Transparent mode's optimizers in ``fit``: ``HPCREP_TRANSPARENT_SCALE_LR`` multiplies the rate
the updates use by the number of ranks, and a ``LossScaleOptimizer`` averages with transparent
mode's reducer before its finiteness check (tests/mpi/test_mixed_precision.py has the overflow
cases).

The model is one bias-free linear unit trained on the mean of its output: the gradient of each
kernel entry is the mean of that input column, so every update is exactly ``-rate x gradient``
and the kernel shows which rate and which gradient were used."""

import keras
import numpy as np
import pytest

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import transparent
from hpcrep.tensorflow.optimizer import is_distributed

STEPS, BATCH = 3, 2


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def mean_output(y_true, y_pred):
    return keras.ops.mean(y_pred)


def linear_model():
    return keras.Sequential([keras.Input((2,)),
                             keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])


def rank_rows(n):
    """STEPS x BATCH rows per rank: transparent ``fit`` gives rank r rows r::n, all r + 1."""
    rows = n * STEPS * BATCH
    x = np.repeat((np.arange(rows) % n + 1.0)[:, None], 2, axis=1).astype(np.float32)
    return x, np.zeros((rows, 1), np.float32)


@pytest.mark.parametrize("scale", [False, True])
def test_transparent_scale_lr_multiplies_the_rate_fit_trains_at(world, monkeypatch, scale):
    _, n = world
    monkeypatch.setenv("HPCREP_TRANSPARENT_SCALE_LR", "1" if scale else "0")
    x, y = rank_rows(n)
    x[:] = 1.0  # gradient 1 on every rank: the kernel moves by the rate alone
    rates, kernels = [], []
    with transparent(announce=False):
        model = linear_model()
        model.compile(keras.optimizers.SGD(0.1), loss=mean_output)
        record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: (
            rates.append(float(np.asarray(model.optimizer.learning_rate))),
            kernels.append(model.get_weights()[0][0, 0])))
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    rate = 0.1 * (n if scale else 1)
    np.testing.assert_allclose(rates, [rate] * STEPS, rtol=1e-6)
    np.testing.assert_allclose(kernels, [-rate * (s + 1) for s in range(STEPS)], rtol=1e-5)


def test_loss_scale_optimizer_applies_the_average(world):
    r, n = world
    x, y = rank_rows(n)
    with transparent(announce=False):
        model = linear_model()
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(opt, loss=mean_output)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        # Transparent mode keeps the optimizers' classes (it wraps Keras's apply; the
        # LossScaleOptimizer's apply averages first, then its inner one applies as it is).
        assert type(opt.inner_optimizer) is keras.optimizers.SGD
        assert not is_distributed(opt) and not is_distributed(opt.inner_optimizer)
    assert float(np.asarray(opt.scale_loss(1.0))) > 1  # its loss scale was in use
    # Rank r's own gradient is r + 1; the update used the average over ranks, (n + 1) / 2.
    kernel = model.get_weights()[0]
    np.testing.assert_allclose(kernel, np.full((2, 1), -0.1 * STEPS * (n + 1) / 2), rtol=1e-5)
    everyone = hvd.allgather_object(kernel)
    assert all(np.array_equal(k, everyone[0]) for k in everyone)
