"""Transparent mode on inputs whose rows, batches or items do not divide among the ranks:
``evaluate`` (and ``fit``'s validation) gives what one process gives on the whole input, and
``fit`` trains every row of arrays exactly once per epoch (``validation_split`` taken from the
whole input); datasets, generators and ``PyDataset``s leave out what does not share out, and
rank 0 warns with the count.

Table-driven over input kinds, at whatever number of ranks the suite runs (tests/mpi runs at 4
and 1; tests/launch/test_transparent_rows.py runs this file at 2 and 3). Each case builds the same
tiny model on every rank (rank 0's initial values) and compares with Keras's own loop on the whole
input in the same process (the one-process reference: :func:`one_process`). Each row's target
carries the row's id in its last column; the ``rows`` metric records, in Python, which ids every
training batch held with a non-zero weight.
"""

from __future__ import annotations

import collections
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import transparent
from hpcrep.tensorflow.transparent.state import keras_loop

ROWS, BATCH = 23, 4  # 23 rows: 6 batches of 4 (the last of 3); divides by none of 2, 3, 4
SEEN: dict[str, list[int]] = {"train": [], "test": []}
PHASE = ["train"]


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def one_process(call):
    """What Keras gives in one process on the whole input: its own loops, nothing sharded."""
    with keras_loop():
        return call()


class Phase(keras.callbacks.Callback):
    """Tell the ``rows`` metric whether a batch trains or evaluates."""

    def on_train_batch_begin(self, batch, logs=None):
        PHASE[0] = "train"

    def on_test_batch_begin(self, batch, logs=None):
        PHASE[0] = "test"


class Rows(keras.metrics.Metric):
    """The total weight of the rows seen (a sum, as Keras's metrics keep); records their ids."""

    def __init__(self, name="rows", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        ids = tf.cast(tf.round(y_true[:, -1]), tf.int64)
        w = (tf.ones_like(y_true[:, -1]) if sample_weight is None
             else tf.reshape(tf.cast(sample_weight, tf.float32), [-1]))
        tf.py_function(_record, [ids, w], [])
        self.total.assign_add(tf.reduce_sum(w))

    def result(self):
        return self.total


def _record(ids, weights):
    SEEN[PHASE[0]].extend(int(i) for i, w in zip(ids.numpy(), weights.numpy()) if w != 0)


def mse_of_target(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true[:, :1] - y_pred), axis=-1)


def data(n=ROWS, seed=3):
    """The same rows on every rank: ``x`` (n, 3), ``y`` (n, 2) = (target, row id), weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = np.stack([rng.normal(size=n) * 3 + 2, np.arange(n)], axis=1).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
    return x, y, w


def model(dict_inputs=False):
    if dict_inputs:
        a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
        h = keras.layers.Concatenate()([a, b])
        m = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(keras.layers.Dense(4)(h)))
    else:
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    m.compile(keras.optimizers.SGD(0.05), loss=mse_of_target, metrics=["mae"],
              weighted_metrics=[Rows()])
    return m


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, i):
        return self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]


def split(x):
    return {"a": x[:, :2], "b": x[:, 2:]}


# kind -> (build the input's arguments for fit/evaluate from (x, y, w), dict inputs?)
KINDS = {
    "arrays": (lambda x, y, w: dict(x=x, y=y, batch_size=BATCH), False),
    "arrays_weighted": (lambda x, y, w: dict(x=x, y=y, sample_weight=w, batch_size=BATCH), False),
    "dict_arrays": (lambda x, y, w: dict(x=split(x), y=y, batch_size=BATCH), True),
    "tfdata": (lambda x, y, w: dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)),
               False),
    "tfdata_weighted": (lambda x, y, w: dict(
        x=tf.data.Dataset.from_tensor_slices((x, y, w)).batch(BATCH)), False),
    "generator": (lambda x, y, w: dict(x=((x[i:i + BATCH], y[i:i + BATCH])
                                          for i in range(0, len(x), BATCH))), False),
    "pydataset": (lambda x, y, w: dict(x=Batches(x, y)), False),
}


@pytest.mark.parametrize("n", [ROWS, 2])  # 2 rows: fewer than ranks at 3 and 4
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_evaluate_equals_one_process(world, kind, n):
    build, dict_inputs = KINDS[kind]
    x, y, w = data(n)
    with transparent(announce=False):
        m = model(dict_inputs)
        got = m.evaluate(**build(x, y, w), verbose=0, return_dict=True)
        want = one_process(lambda: m.evaluate(**build(x, y, w), verbose=0, return_dict=True))
    weights = w if "weighted" in kind else np.ones(n, np.float32)
    assert want["rows"] == pytest.approx(float(weights.sum()), rel=1e-6)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-6, err_msg=f"{kind} {key}")
    every = hc.allgather_object(got)
    assert all(e == every[0] for e in every), every


def test_evaluate_returns_a_list_like_keras(world):
    x, y, _ = data()
    with transparent(announce=False):
        m = model()
        got = m.evaluate(x, y, batch_size=BATCH, verbose=0)
        want = one_process(lambda: m.evaluate(x, y, batch_size=BATCH, verbose=0))
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_fit_validation_metrics_equal_one_process(world):
    x, y, w = data()
    xv, yv, wv = data(11, seed=5)
    with transparent(announce=False):
        m = model()
        history = m.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                        validation_data=(xv, yv, wv), callbacks=[Phase()])
        want = one_process(lambda: m.evaluate(xv, yv, sample_weight=wv, batch_size=BATCH,
                                              verbose=0, return_dict=True))
    for key in want:
        np.testing.assert_allclose(history.history[f"val_{key}"][0], want[key], rtol=2e-6,
                                   err_msg=key)


def trained(fit):
    """Run ``fit()`` and return (how often each row id trained with a non-zero weight, on all
    ranks together; the texts of the warnings hpcrep gave on this rank)."""
    SEEN["train"].clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    seen = collections.Counter(i for ids in hc.allgather_object(list(SEEN["train"])) for i in ids)
    return seen, [str(c.message) for c in caught if "hpcrep transparent mode" in str(c.message)]


def left_out(kind, n, size):
    """The row ids a kind of input leaves out of an epoch: none for arrays; the last ``batches
    % size`` batches of batched input."""
    if kind.endswith("arrays") or kind == "arrays_weighted":
        return set()
    batches = -(-n // BATCH)
    return set(range((batches - batches % size) * BATCH, n))


@pytest.mark.parametrize("rows", ["23", "4n+1"])  # 4n+1: ranks short of a step get padded
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fit_trains_each_row_once_per_epoch_or_warns(world, kind, rows):
    rank, size = world
    n = ROWS if rows == "23" else BATCH * size + 1
    build, dict_inputs = KINDS[kind]
    x, y, w = data(n)
    with transparent(announce=False):
        m = model(dict_inputs)
        seen, warned = trained(lambda: m.fit(**build(x, y, w), epochs=1, verbose=0,
                                             callbacks=[Phase()]))
    missing = left_out(kind, n, size)
    assert set(seen) == set(range(n)) - missing, (sorted(seen), sorted(missing))
    assert set(seen.values()) == {1}, seen
    if rank == 0 and missing:
        assert len(warned) == 1 and f"({len(missing)} rows)" in warned[0], warned
    else:
        assert warned == [], warned


def test_validation_split_is_the_last_rows_of_the_whole_input(world):
    x, y, w = data()
    with transparent(announce=False):
        m = model()
        history = {}

        def fit():
            history["h"] = m.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=1, verbose=0,
                                 validation_split=0.2, callbacks=[Phase()])

        seen, warned = trained(fit)
        want = one_process(lambda: m.evaluate(x[18:], y[18:], sample_weight=w[18:],
                                              batch_size=BATCH, verbose=0, return_dict=True))
    assert sorted(seen) == list(range(18)) and set(seen.values()) == {1}, seen  # as Keras: 18.4
    assert warned == []
    for key in want:
        np.testing.assert_allclose(history["h"].history[f"val_{key}"][0], want[key], rtol=2e-6,
                                   err_msg=key)
