"""hvd.callbacks.BackupAndRestore on every rank: a backup resumes with rank 0's state on every
rank, a backup rank 0 cannot write or read raises on every rank (no hang), and saves leave no
temporary files behind. Runs under ``mpirun -n 4`` and ``-n 1``."""

import os

import keras
import numpy as np
import pytest

import hpcrep.comm as hc
import hpcrep.tensorflow.keras as hvd
from hpcrep.errors import RemoteError

B = 8


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def make_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse", jit_compile=False)
    return model


def fit(model, r, epochs, callbacks):
    rng = np.random.default_rng(r)
    x = rng.normal(size=(4 * B, 4)).astype("float32")
    return model.fit(x, x.sum(axis=1, keepdims=True), batch_size=B, epochs=epochs, shuffle=False,
                     verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           *callbacks])


def test_resume_gives_every_rank_rank_zeros_backup(world, shared_dir):
    r, n = world
    straight = make_model(1)
    fit(straight, r, 3, [])
    first = make_model(1)
    fit(first, r, 2, [hvd.callbacks.BackupAndRestore(shared_dir, delete_checkpoint=False)])
    assert sorted(os.listdir(shared_dir)) == (["latest.weights.h5", "training_metadata.json"]
                                              if r == 0 else sorted(os.listdir(shared_dir)))
    if r == 0:
        assert not [f for f in os.listdir(shared_dir) if ".tmp-" in f]
    resumed = make_model(50 + r)  # every rank starts elsewhere, as a fresh process would
    history = fit(resumed, r, 3, [hvd.callbacks.BackupAndRestore(shared_dir)])
    assert len(history.history["loss"]) == 1  # only the third epoch ran
    assert len(resumed.get_weights()) == len(straight.get_weights()) == 4
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_array_equal(a, b)
    gathered = hc.allgather_object([v.numpy() for v in resumed.optimizer.variables])
    assert gathered[0], "the resumed optimizer has no variables"
    for other in gathered[1:]:
        assert len(other) == len(gathered[0])
        for a, b in zip(gathered[0], other):
            np.testing.assert_array_equal(a, b)
    hc.barrier()
    assert not os.path.exists(shared_dir) or r != 0  # delete_checkpoint: rank 0 removed it


def test_unwritable_backup_dir_raises_on_every_rank(world, shared_dir):
    r, n = world
    blocker = os.path.join(shared_dir, "file")
    if r == 0:
        open(blocker, "w").close()  # a file where the directory should go
    hc.barrier()
    # Rank 0 raises what it met (a file where the directory should go); the others are told
    # that rank 0 failed, and where.
    if r == 0:
        expected = pytest.raises(NotADirectoryError, match="Not a directory")
    else:
        expected = pytest.raises(RemoteError, match="rank 0 failed in .*backup")
    with expected:
        fit(make_model(2), r, 1, [hvd.callbacks.BackupAndRestore(os.path.join(blocker, "b"))])


def test_unreadable_backup_raises_on_every_rank(world, shared_dir):
    r, n = world
    if r == 0:
        with open(os.path.join(shared_dir, "latest.weights.h5"), "wb") as f:
            f.write(b"not an HDF5 file")
    hc.barrier()
    if r == 0:  # h5py's error for a file that is not HDF5
        expected = pytest.raises(OSError, match="file signature not found")
    else:
        expected = pytest.raises(RemoteError, match="rank 0 failed in restoring the backup")
    with expected:
        fit(make_model(3), r, 1, [hvd.callbacks.BackupAndRestore(shared_dir)])


def test_transparent_load_weights_needs_the_file_on_rank_zero_only(world, shared_dir):
    """Under transparent mode only rank 0 reads: other ranks name a file they do not have (as on
    a node-local disk) and still end with rank 0's weights and optimizer state."""
    from hpcrep.tensorflow import transparent

    r, n = world
    source = make_model(5)
    source.optimizer.build(source.trainable_variables)
    source.optimizer.iterations.assign(7)
    path = os.path.join(shared_dir, "only-rank-0.weights.h5")
    if r == 0:
        source.save_weights(path)
    hc.barrier()
    mine = path if r == 0 else os.path.join(shared_dir, f"missing-{r}.weights.h5")
    with transparent(announce=False):
        target = make_model(60 + r)
        target.optimizer.build(target.trainable_variables)
        target.load_weights(mine)
    assert len(target.get_weights()) == len(source.get_weights()) == 4
    for a, b in zip(target.get_weights(), source.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(target.optimizer.iterations.numpy()) == 7


def test_transparent_load_weights_of_a_missing_file_raises_on_every_rank(world, shared_dir):
    from hpcrep.tensorflow import transparent

    r, n = world
    with transparent(announce=False):
        model = make_model(4)
        if r == 0:  # h5py's error for the missing file, naming it
            expected = pytest.raises(FileNotFoundError, match="absent.weights.h5")
        else:
            expected = pytest.raises(RemoteError, match="rank 0 failed in model.load_weights")
        with expected:
            model.load_weights(os.path.join(shared_dir, "absent.weights.h5"))
