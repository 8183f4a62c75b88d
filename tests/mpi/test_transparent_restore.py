"""``with hpcrep.tensorflow.transparent():`` trains data-parallel; every patch is undone on exit.

Runs under ``mpirun -n 4`` and ``-n 1`` (make test-mpi)."""

import builtins
import io
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context as tf_context

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import transparent
from hpcrep.tensorflow.transparent import PatchSet, installers, is_active, on_rank_zero


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def patch_points():
    """(owner, attribute) of everything transparent mode patches."""
    model = keras.Model
    owners = {name: next(k for k in model.__mro__ if name in vars(k))
              for name in ("fit", "evaluate", "predict", "compile", "save", "save_weights",
                                 "load_weights")}
    var_owner = next(k for k in keras.Variable.__mro__ if "_initialize" in vars(k))
    opt_owner = next(k for k in keras.optimizers.Optimizer.__mro__ if "apply" in vars(k))
    ds_owner = next(k for k in tf.data.Dataset.__mro__ if "__iter__" in vars(k))
    return ([(owners[n], n) for n in owners] + [(var_owner, "_initialize"), (opt_owner, "apply"),
                                                 (ds_owner, "__iter__"), (tf, "function")])


def snapshot():
    return {(o, name): vars(o).get(name) for o, name in patch_points()}


def small_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def test_every_patch_is_restored_on_exit(world):
    r, n = world
    keras.utils.set_random_seed(1234 + r)
    before, stdout, seed = snapshot(), sys.stdout, tf_context.global_seed()
    model = small_model()
    opt = keras.optimizers.SGD(0.1)
    model.compile(opt, "mse")
    with transparent(announce=False) as patches:
        assert is_active()
        during = snapshot()
        changed = [key for key in before if during[key] is not before[key]]
        assert len(changed) == len(before), "some patch point was not patched"
        model.fit(np.ones((16, 3), np.float32), np.zeros((16, 1), np.float32), batch_size=2,
                  verbose=0)
        assert type(opt) is keras.optimizers.SGD  # averaged by the patched apply, class kept
        assert patches.labels
    assert not is_active()
    after = snapshot()
    assert all(after[key] is before[key] for key in before)
    assert type(opt) is keras.optimizers.SGD
    assert sys.stdout is stdout
    assert tf_context.global_seed() == seed


def test_each_install_patches_attributes_of_its_own(world):
    # installers() may run the local installs in any order only because no two of them patch the
    # same attribute; and each install's patches are undone by its own PatchSet.
    before = snapshot()
    patched_by = {}
    for module in installers():
        patches = PatchSet()
        module.install(patches)
        try:
            changed = [key for key, value in snapshot().items() if value is not before[key]]
        finally:
            patches.restore()
        assert all(snapshot()[key] is before[key] for key in before), module.__name__
        for key in changed:
            assert key not in patched_by, \
                f"{key} patched by {patched_by[key]} and {module.__name__}"
            patched_by[key] = module.__name__
    assert set(patched_by) == set(before)


def test_xla_is_off_in_compile_and_in_tf_function(world):
    # hpcrep's collectives cannot be compiled by XLA (they raise if they are): both ways of
    # asking for it are turned off while transparent mode is active.
    r, n = world
    with transparent(announce=False):
        model = small_model()
        model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=True)
        model.fit(np.ones((4 * n, 3), np.float32), np.zeros((4 * n, 1), np.float32), batch_size=2,
                  verbose=0)

        @tf.function(jit_compile=True)
        def total(x):
            return hvd.allreduce(x, op=hvd.Sum)

        got = float(total(tf.constant(float(r))))
    assert model.jit_compile is False
    assert got == n * (n - 1) / 2


def test_restored_even_when_the_body_raises(world):
    before = snapshot()
    with pytest.raises(ZeroDivisionError):
        with transparent(announce=False):
            raise ZeroDivisionError("the body fails")
    assert all(snapshot()[key] is before[key] for key in before)


def test_training_inside_the_context_is_data_parallel(world):
    r, n = world
    keras.utils.set_random_seed(7 + r)  # different local starts on purpose
    x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3) / 100
    y = x.sum(axis=1, keepdims=True)
    with transparent(announce=False):
        model = small_model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
        history = model.fit(x, y, batch_size=4, epochs=3, verbose=0)
        predictions = model.predict(x, batch_size=5, verbose=0)
        loss = model.evaluate(x, y, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    # each rank ran 64 / n / 4 steps: the optimizer counted them
    assert int(model.optimizer.iterations.numpy()) == 3 * (64 // n // 4)
    np.testing.assert_allclose(predictions, model(x).numpy(), rtol=1e-5, atol=1e-6)
    everyone = hvd.allgather_object([w for w in model.get_weights()] + [loss])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)


def test_plain_tf_variables_start_with_rank_zeros_value(world):
    r, n = world
    with transparent(announce=False):
        weights = tf.Variable(np.full((2, 3), float(r), np.float32))
        generator = tf.random.Generator.from_seed(100 + r)  # its state is a tf.Variable
        layer = keras.layers.Dense(2)  # a Keras variable inside: broadcast once, not twice
        layer.build((None, 3))
        draws = generator.normal((4,)).numpy()
    local = tf.Variable(float(r))  # after exit, creation is local again
    np.testing.assert_array_equal(weights.numpy(), np.zeros((2, 3), np.float32))
    everyone = hvd.allgather_object((draws, layer.get_weights(), float(local.numpy())))
    for other in everyone[1:]:
        np.testing.assert_array_equal(other[0], everyone[0][0])
        for a, b in zip(other[1], everyone[0][1]):
            np.testing.assert_array_equal(a, b)
    assert [e[2] for e in everyone] == [float(i) for i in range(n)]


class ShiftedSGD(keras.optimizers.SGD):
    """A user's optimizer whose own ``apply`` adds 1 to every gradient, then calls Keras's."""

    def apply(self, grads, trainable_variables=None):
        self.override_calls = getattr(self, "override_calls", 0) + 1
        return super().apply([g + 1.0 for g in grads], trainable_variables)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_each_apply_reduces_once_and_runs_the_optimizer_once(world, compiled):
    # One wrapper around Keras's apply: the user's override runs once per step (not again after
    # the average), and Keras's apply (which counts iterations) once per step.
    r, n = world
    with transparent(announce=False):
        w = tf.Variable([0.0, 0.0])  # created eagerly: rank 0's value everywhere
        opt = ShiftedSGD(learning_rate=1.0)

        def step():
            opt.apply([tf.constant([float(r), 2.0 * r])], [w])

        step = tf.function(step) if compiled else step
        for _ in range(3):
            step()
    # each step: w -= mean over ranks of (g_r + 1), g_r = (r, 2r), mean r = (n - 1) / 2
    mean_r = (n - 1) / 2
    np.testing.assert_allclose(w.numpy(), [-3 * (mean_r + 1), -3 * (2 * mean_r + 1)], rtol=1e-6)
    assert int(opt.iterations.numpy()) == 3
    assert opt.override_calls == (1 if compiled else 3)  # a tf.function traces once
    assert type(opt) is ShiftedSGD  # nothing left behind on exit


@pytest.mark.timeout(60)
def test_on_rank_zero_is_true_on_rank_0_only():
    with transparent(announce=False):
        inside = on_rank_zero()
    assert inside == (hvd.rank() == 0) == on_rank_zero()
    assert sum(hvd.allgather_object(inside)) == 1


def test_the_scripts_own_files_are_patched_under_a_script_and_restored_on_exit(world, tmp_path):
    # python -m hpcrep passes the script: here this file is "the script". Every rank writes
    # a file of its own tmp_path; on disk it exists on rank 0 alone, each rank reads its own back.
    r, n = world
    originals = (builtins.open, io.open, os.mkdir, os.makedirs)
    path = tmp_path / "notes.txt"
    with transparent(announce=False, script=__file__):
        assert (builtins.open is originals[0]) == (r == 0)
        with open(path, "w") as f:
            f.write(f"rank {r}")
        with open(path) as f:
            back = f.read()
        on_disk = path.exists()
    assert back == f"rank {r}"
    assert on_disk == (r == 0) == path.exists()
    assert (builtins.open, io.open, os.mkdir, os.makedirs) == originals
    with transparent(announce=False):  # from code, without a script: nothing of the sort
        assert (builtins.open, io.open, os.mkdir, os.makedirs) == originals
