"""Mixed precision never splits the ranks: with a ``LossScaleOptimizer`` every rank applies or
skips the same steps and keeps the same loss scale, even when only one rank's gradients overflow.

The highest rank's inputs are multiplied by 6e4 on two of the steps, so its float16 forward pass
overflows there and its local gradients are not finite; the other ranks' are. Checked on local
gradients, that rank would skip its update and the gradient exchange while the others wait in
it (a hang, until the stall watchdog or this file's timeout ends the job). Every API and wrapping
order a user may write is run: ``compile`` wrapping a ``DistributedOptimizer``, a
``DistributedOptimizer`` around a ``LossScaleOptimizer``, transparent mode, a custom loop with
``DistributedGradientTape``, the Replicator's ``wrap_optimizer``, fp16 compression. At one rank
the same code runs (that rank overflows alone). The outcome asserted is the same everywhere:
weights bitwise equal on every rank, the same loss scale and step count on every rank, and the
overflow steps skipped (fewer optimizer iterations than steps, a loss scale below its start).
"""

import hashlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import CollectiveArgumentError
from hpcrep.replicator import Replicator
from hpcrep.tensorflow import transparent

pytestmark = pytest.mark.timeout(180)

STEPS, BATCH, OVERFLOW_STEPS = 6, 4, (1, 4)
INITIAL_SCALE = 2.0 ** 15


@pytest.fixture(autouse=True)
def _mixed_float16():
    hvd.init()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def local_data(rank, size):
    """This rank's STEPS x BATCH rows; the highest rank's overflow float16 on OVERFLOW_STEPS."""
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 1)).astype(np.float32)
    if rank == size - 1:
        for step in OVERFLOW_STEPS:
            x[step * BATCH:(step + 1) * BATCH] *= 6e4
    return x, y


def global_data(size):
    """Rows laid out so that transparent ``fit`` (rank r gets rows r::size) gives each rank its
    :func:`local_data`."""
    parts = [local_data(r, size) for r in range(size)]
    x = np.empty((STEPS * BATCH * size, 3), np.float32)
    y = np.empty((STEPS * BATCH * size, 1), np.float32)
    for r, (xr, yr) in enumerate(parts):
        x[r::size], y[r::size] = xr, yr
    return x, y


def make_model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(1)])


def outcome(model, optimizer):
    """(digest of the weights, loss scale, optimizer iterations) on this rank."""
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    return digest, float(np.asarray(optimizer.dynamic_scale)), int(np.asarray(
        optimizer.iterations))


def assert_agreed(model, optimizer):
    mine = outcome(model, optimizer)
    everyone = hvd.allgather_object(mine)
    assert all(o == everyone[0] for o in everyone), everyone
    _, scale, iterations = mine
    # Every skipped step halved the scale (it never grows back within STEPS); the planted
    # overflows are skipped, and a rank's own data may overflow a step at the initial scale too.
    skipped = STEPS - iterations
    assert scale == INITIAL_SCALE / 2 ** skipped, (scale, everyone)
    assert skipped >= len(OVERFLOW_STEPS), (iterations, everyone)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def fit_explicit(optimizer):
    r, n = hvd.rank(), hvd.size()
    x, y = local_data(r, n)
    model = make_model()
    model.compile(optimizer, "mse", jit_compile=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model, model.optimizer


def test_compile_wraps_a_distributed_optimizer():
    model, opt = fit_explicit(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)))
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)  # compile made LSO(Dist(SGD))
    assert_agreed(model, opt)


def test_distributed_optimizer_around_a_loss_scale_optimizer():
    model, opt = fit_explicit(hvd.DistributedOptimizer(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))))
    assert_agreed(model, opt)


def test_fp16_compression_under_a_mixed_policy():
    model, opt = fit_explicit(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                       compression=hvd.Compression.fp16))
    assert_agreed(model, opt)


def test_transparent_fit():
    x, y = global_data(hvd.size())
    with transparent(announce=False):
        model = make_model()
        model.compile(keras.optimizers.SGD(0.01), "mse")
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_agreed(model, model.optimizer)


@pytest.mark.parametrize("api", ["tape", "replicator", "transparent"])
def test_custom_loop(api):
    r, n = hvd.rank(), hvd.size()
    x, y = local_data(r, n)
    if api == "transparent":
        with transparent(announce=False):
            model, opt = _custom_loop(keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.01)), x, y, wrap_tape=False)
    elif api == "replicator":
        with Replicator() as rep:
            opt = rep.wrap_optimizer(keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.01)))
            model, opt = _custom_loop(opt, x, y, wrap_tape=False)
    else:
        model, opt = _custom_loop(keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.01)), x, y, wrap_tape=True)
    assert_agreed(model, opt)


def _custom_loop(opt, x, y, wrap_tape):
    model = make_model()
    opt.build(model.trainable_variables)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            out = keras.ops.cast(model(xb), "float32")  # float16 under the policy
            loss = keras.ops.mean(keras.ops.square(out - yb))
            scaled = opt.scale_loss(loss)
        if wrap_tape:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    for s in range(STEPS):
        step(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH])
    return model, opt


def test_bfloat16_policy_keeps_ranks_equal():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    r, n = hvd.rank(), hvd.size()
    x, y = local_data(r, n)
    model = make_model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", jit_compile=False)
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    assert len(set(hvd.allgather_object(digest))) == 1


def test_accumulating_inner_optimizer_is_refused_on_every_rank():
    x, y = local_data(hvd.rank(), hvd.size())
    inner = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), backward_passes_per_step=2)
    with pytest.raises(CollectiveArgumentError, match="Wrap the other way round"):
        fit_explicit(inner)
