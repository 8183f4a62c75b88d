"""Under ``mixed_float16`` a checkpoint carries the loss scale: after a few steps in which the
scale has moved (one step's gradients overflow, a small ``dynamic_growth_steps`` doubles it), a
save and a restore into a fresh model give every rank the same ``dynamic_scale``,
``step_counter``, inner iterations, momentum slots and weights, bit for bit, and one more epoch
from there equals one more epoch of the run that was never interrupted.

Covered: the explicit ``CheckpointManager`` with ``training_state``/``load_training_state``,
``CheckpointCallback`` (what ``HPCREP_CHECKPOINT_DIR`` adds to a transparent ``fit``) and
``hvd.callbacks.BackupAndRestore``; the optimizer wrapped as
``DistributedOptimizer(LossScaleOptimizer(SGD))`` and as ``compile`` wraps it,
``LossScaleOptimizer(DistributedOptimizer(SGD))``; in both the gradients are averaged before the
finiteness check (:mod:`hpcrep.tensorflow.loss_scale`), so the last rank's overflow is every
rank's skip.
"""

import keras
import numpy as np
import pytest

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import CheckpointManager
from hpcrep.tensorflow.checkpoint_callback import (CheckpointCallback, load_training_state,
                                                   training_state)
from hpcrep.tensorflow.keras.callbacks import BackupAndRestore

B, BATCHES, OVERFLOW_BATCH = 4, 7, 3
INITIAL_SCALE, GROWTH_STEPS = 2.0 ** 10, 2


@pytest.fixture(autouse=True, scope="module")
def _mixed_float16():
    hvd.init()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy(previous)


def make_model(order, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    sgd = keras.optimizers.SGD(0.05, momentum=0.9)
    if order == "distributed_outside":
        optimizer = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
            sgd, initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS))
    else:  # compile wraps it: LossScaleOptimizer(DistributedOptimizer(sgd)), Keras's defaults
        optimizer = hvd.DistributedOptimizer(sgd)
    model.compile(optimizer, "mse", jit_compile=False)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    return model


def data(order, r, n):
    """This rank's rows; batch OVERFLOW_BATCH holds 1e5, past float16's range, on the last rank
    only (in either order)."""
    rng = np.random.default_rng(r)
    x = rng.normal(size=(BATCHES * B, 4)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")
    if r == n - 1:
        x[OVERFLOW_BATCH * B] = 1e5
    return x, y


def fit(model, data_xy, epochs, initial_epoch=0, callbacks=()):
    x, y = data_xy
    model.fit(x, y, batch_size=B, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, callbacks=list(callbacks))


def snapshot(optimizer):
    """``[(name, value)]`` of every optimizer variable (the wrapper's and the inner one's); a
    slot is named for its kind only (``kernel_momentum``): the full name carries the model's."""
    return [(_kind(v.name), np.array(v.numpy(), copy=True)) for v in optimizer.variables]


def _kind(name):
    return "_".join(name.split("_")[-2:]) if name.endswith("_momentum") else name


class Snapshot(keras.callbacks.Callback):
    """Records the optimizer's state when training begins (after a restore by earlier callbacks)."""

    def on_train_begin(self, logs=None):
        self.state = snapshot(self.model.optimizer)
        self.weights = [np.array(w, copy=True) for w in self.model.get_weights()]


def assert_same(a, b):
    assert [name for name, _ in a] == [name for name, _ in b]
    for (name, x), (_, y) in zip(a, b):
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("order", ["distributed_outside", "compile_wraps"])
@pytest.mark.parametrize("path", ["manager", "callback", "backup"])
def test_loss_scale_survives_save_and_restore(path, order, world, shared_dir):
    r, n = world
    xy = data(order, r, n)
    trained = make_model(order, seed=1)
    saver = []
    if path == "callback":
        saver = [CheckpointCallback(shared_dir, signum=None)]
    elif path == "backup":
        saver = [BackupAndRestore(shared_dir, delete_checkpoint=False)]
    fit(trained, xy, epochs=1, callbacks=saver)
    lso = trained.optimizer
    saved = snapshot(lso)
    saved_weights = [np.array(w, copy=True) for w in trained.get_weights()]
    if path == "manager":
        CheckpointManager(shared_dir).save(training_state(trained, lso), step=BATCHES)

    fresh = make_model(order, seed=50 + r)  # a new process would start elsewhere, per rank
    restored = Snapshot()
    if path == "manager":
        load_training_state(CheckpointManager(shared_dir).restore(), fresh, fresh.optimizer)
        fit(fresh, xy, epochs=2, initial_epoch=1, callbacks=[restored])
    elif path == "callback":
        callback = CheckpointCallback(shared_dir, signum=None)
        assert callback.restore(fresh) == 1
        fit(fresh, xy, epochs=2, initial_epoch=1, callbacks=[restored, callback])
    else:  # restores in on_train_begin, before Snapshot's, and resumes at epoch 1
        fit(fresh, xy, epochs=2,
            callbacks=[BackupAndRestore(shared_dir, delete_checkpoint=False), restored])
    fit(trained, xy, epochs=2, initial_epoch=1)  # the run that was never interrupted
    everyone = hc.allgather_object(snapshot(fresh.optimizer))  # the last collective: a failed
    # check below on one rank must not leave the others waiting in a collective

    # The state worth saving had moved: the scale was not its initial value, the growth counter
    # was mid-count, and the overflowing step was skipped (inner iterations count applied steps;
    # at Keras's initial 2**15 the first step may overflow in float16 too).
    names = [name for name, _ in saved]
    assert "dynamic_scale" in names and "step_counter" in names and "iteration" in names
    assert names.count("kernel_momentum") == names.count("bias_momentum") == 2, names
    initial = INITIAL_SCALE if order == "distributed_outside" else lso.initial_scale
    assert float(dict(saved)["dynamic_scale"]) != initial
    assert int(dict(saved)["step_counter"]) > 0
    assert int(saved[names.index("iteration", 1)][1]) <= BATCHES - 1  # the inner optimizer's
    # Restored: all of it, bit for bit; then one more epoch equals the uninterrupted run's.
    assert_same(restored.state, saved)
    for a, b in zip(restored.weights, saved_weights):
        np.testing.assert_array_equal(a, b)
    assert_same(snapshot(fresh.optimizer), snapshot(trained.optimizer))
    assert len(fresh.get_weights()) == len(trained.get_weights()) == 4
    for a, b in zip(fresh.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(a, b)
    for other in everyone[1:]:
        assert_same(other, everyone[0])
