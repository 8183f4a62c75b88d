"""Transparent ``fit`` with ``HPCREP_TRANSPARENT_ELASTIC`` and ``HPCREP_ELASTIC_DIR`` (what
``hpcrep run --elastic`` sets): it commits each epoch to the directory, and a ``fit`` that finds
a commit there (a relaunched script) resumes from it, also a model that only its first step
would build. Runs under ``mpirun -n 4`` and ``-n 1`` (make test-mpi)."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import commit_file
from hpcrep.tensorflow.elastic import state as elastic_state
from hpcrep.tensorflow.transparent import transparent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def unbuilt_model(seed: int) -> keras.Model:
    """A model without an Input, built by Keras in its first step, its initial weights drawn
    from ``seed`` (each rank alike; transparent mode broadcasts rank 0's anyway)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def train(x, y, epochs: int, as_dataset: bool, seed: int = 7):
    """A script's ``fit``, as run again by a relaunch: its state is the first one created."""
    elastic_state._state_ids = itertools.count(1000)
    model = unbuilt_model(seed)
    with transparent(announce=False):
        if as_dataset:
            history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4),
                                epochs=epochs, verbose=0)
        else:
            history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0)
    return model, history


@pytest.mark.parametrize("as_dataset,scale_lr", [(False, False), (True, False), (False, True)],
                         ids=["arrays", "dataset", "arrays-scaled-lr"])
def test_a_relaunched_fit_resumes_from_the_commit_of_its_last_epoch(world, monkeypatch,
                                                                   tmp_path, as_dataset,
                                                                   scale_lr):
    """With ``HPCREP_TRANSPARENT_SCALE_LR`` the commit holds the rate the script set, and the
    relaunch scales it once for its own size (as an uninterrupted run did)."""
    r, n = world
    rows = np.random.default_rng(0).normal(size=(32 * n, 5)).astype("float32")
    target = rows.sum(axis=1, keepdims=True)
    monkeypatch.setenv("HPCREP_TRANSPARENT_ELASTIC", "1")
    monkeypatch.setenv("HPCREP_TRANSPARENT_SCALE_LR", "1" if scale_lr else "0")
    reference, whole = train(rows, target, 4, as_dataset)  # without a directory: no commits

    directory = hvd.broadcast_object(str(tmp_path), 0)  # rank 0 writes, every rank resumes
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", directory)
    _, first = train(rows, target, 2, as_dataset)  # the job that stopped after 2 epochs
    assert first.epoch == [0, 1]
    # the relaunch (other initial weights, which the commit replaces): epochs 3 and 4 only
    model, resumed = train(rows, target, 4, as_dataset, seed=99)
    assert resumed.epoch == [0, 1, 2, 3]  # one History: the committed epochs and its own
    np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"], rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == \
        int(reference.optimizer.iterations.numpy())  # Adam's state came back with the weights
    np.testing.assert_allclose(float(model.optimizer.learning_rate.numpy()),
                               0.01 * (n if scale_lr else 1), rtol=1e-6)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather_object([w.tolist() for w in model.get_weights()])
    assert all(g == gathered[0] for g in gathered)


class CountRows(keras.layers.Layer):
    """Passes ``x[:, 1:]`` on and, in training, adds to ``seen`` how many times each row id
    (``x[:, 0]``) was trained, summed over the ranks: every rank holds the job's count, and the
    commits carry it like any other variable."""

    def __init__(self, rows: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows = rows

    def build(self, input_shape) -> None:
        self.seen = self.add_weight(shape=(self.rows,), initializer="zeros", trainable=False,
                                    name="seen")

    def call(self, x, training=False):
        if training:
            ids = tf.cast(x[:, 0], tf.int32)
            counts = tf.cast(tf.math.bincount(ids, minlength=self.rows, maxlength=self.rows),
                             tf.float32)
            self.seen.assign_add(hvd.allreduce(counts, op=hvd.Sum, name="rows_seen"))
        return x[:, 1:]


class StopAt(keras.callbacks.Callback):
    """Ends the ``fit`` (an exception on every rank, as a job that fails) after ``batch`` of
    ``epoch``: what the commit on disk holds is all that a relaunch gets."""

    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.stop_epoch, self.stop_batch, self.epoch = epoch, batch, -1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == (self.stop_epoch, self.stop_batch):
            raise RuntimeError("the job fails here")


def counted_fit(rows: int, epochs: int, seed: int, shuffle: bool, callbacks=()):
    """A script's ``fit`` on row ids and features, its ``CountRows`` counting what it trains;
    the last fifth of the rows for validation (``validation_split``)."""
    elastic_state._state_ids = itertools.count(1000)
    keras.utils.set_random_seed(seed)
    data = np.random.default_rng(0).normal(size=(rows, 3)).astype("float32")
    x = np.concatenate([np.arange(rows, dtype="float32")[:, None], data], axis=1)
    y = data.sum(axis=1, keepdims=True)
    inputs = keras.Input((4,))
    count = CountRows(rows)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, "tanh")(
        count(inputs))))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    with transparent(announce=False):
        history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=shuffle, verbose=0,
                            callbacks=list(callbacks), validation_split=0.2)
    return model, history, count


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_a_fit_relaunched_mid_epoch_trains_every_row_exactly_once(world, monkeypatch, tmp_path,
                                                                  shuffle):
    """``HPCREP_ELASTIC_BATCHES_PER_COMMIT=3``: a job that fails after batch 7 of its second
    epoch left the commit after 6 batches of it; the relaunch (other initial weights, other
    numpy seed) trains the rest of that epoch and the third: every row trained once per epoch,
    and the weights and Adam's state of an uninterrupted run, to rounding."""
    r, n = world
    rows = 10 * 4 * n  # 8 steps an epoch, no row left over; 2 x 4 x n rows for validation
    trained = np.concatenate([np.full(8 * 4 * n, 3.0), np.zeros(2 * 4 * n)])
    monkeypatch.setenv("HPCREP_TRANSPARENT_ELASTIC", "1")
    monkeypatch.setenv("HPCREP_ELASTIC_BATCHES_PER_COMMIT", "3")
    base = hvd.broadcast_object(str(tmp_path), 0)
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", os.path.join(base, "uninterrupted"))
    reference, whole, reference_count = counted_fit(rows, 3, 7, shuffle)
    np.testing.assert_array_equal(reference_count.seen.numpy(), trained)

    monkeypatch.setenv("HPCREP_ELASTIC_DIR", os.path.join(base, "relaunched"))
    with pytest.raises(RuntimeError, match="the job fails here"):
        counted_fit(rows, 3, 7, shuffle, [StopAt(epoch=1, batch=7)])
    model, resumed, count = counted_fit(rows, 3, 99, shuffle)
    assert resumed.epoch == [0, 1, 2]
    np.testing.assert_array_equal(count.seen.numpy(), trained)  # exactly once, validation never
    for key in ("loss", "val_loss"):  # epoch 2's loss is of its rest only
        np.testing.assert_allclose(resumed.history[key][::2], whole.history[key][::2], rtol=1e-5)
    np.testing.assert_allclose(resumed.history["val_loss"][1], whole.history["val_loss"][1],
                               rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == \
        int(reference.optimizer.iterations.numpy()) == 3 * 8
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather_object([w.tolist() for w in model.get_weights()])
    assert all(g == gathered[0] for g in gathered)


def test_a_commit_with_fewer_rows_left_than_ranks_drops_them_and_goes_on(world, monkeypatch,
                                                                          tmp_path, capfd):
    """A relaunch on more ranks than rows were left in the commit's epoch (its commit came after
    the last full global batch of fewer ranks): those rows are dropped, as the rows that do not
    fill every rank at an epoch's end are, and the next epoch starts. (The commit is edited to
    say so: the world here cannot change size.)"""
    r, n = world
    rows = 10 * 4 * n
    monkeypatch.setenv("HPCREP_TRANSPARENT_ELASTIC", "1")
    monkeypatch.setenv("HPCREP_ELASTIC_BATCHES_PER_COMMIT", "3")
    directory = hvd.broadcast_object(str(tmp_path), 0)
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", directory)
    with pytest.raises(RuntimeError, match="the job fails here"):
        counted_fit(rows, 3, 7, True, [StopAt(epoch=1, batch=7)])
    if r == 0:
        path = os.path.join(directory, "elastic-state-1000.npz")
        snapshot = commit_file.read(path)
        assert snapshot["attrs"]["rows"] == 6 * 4 * n  # after batch 6 of the second epoch
        snapshot["attrs"]["rows"] = 8 * 4 * n - (n - 1)  # fewer rows left than ranks
        commit_file.write(path, snapshot["values"], snapshot["attrs"])
    hvd.barrier()
    capfd.readouterr()
    model, resumed, count = counted_fit(rows, 3, 99, True)
    if r == 0:
        assert f"hpcrep: the {n - 1} rows left of epoch 2 are fewer than the {n} ranks: they " \
            "are dropped" in capfd.readouterr().err
    assert resumed.epoch == [0, 2]  # the second epoch logged nothing of its own
    assert int(model.optimizer.iterations.numpy()) == 6 + 8 + 8  # 6 before the commit
    seen = count.seen.numpy()[:8 * 4 * n]
    assert sorted(set(seen.tolist())) == [2.0, 3.0]  # epochs 1 and 3; epoch 2 up to its commit
    assert int((seen == 3.0).sum()) == 6 * 4 * n
