"""Transparent mode's input sharding, by kind of input: the gaps mutation testing found.

`make mutation` showed that :func:`~hpcrep.tensorflow.transparent.sharding.shard_input` (which
sharding each kind of Keras input gets) had no one-process test, and that unequal sharding and
the PyDataset's options and errors were not checked. One process, ranks given as arguments.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcrep.errors import TransparentModeError
from hpcrep.tensorflow.transparent import sharding


class Batches(keras.utils.PyDataset):
    def __init__(self, n, **kwargs):
        super().__init__(**kwargs)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 1), i), np.zeros((2, 1))


def test_one_rank_and_no_input_are_left_alone():
    x, y = np.arange(5), np.arange(5)
    got_x, others, kind = sharding.shard_input(x, [y, None], 0, 1, equal=True)
    assert got_x is x and others == [y, None] and kind == "arrays"
    assert sharding.shard_input(None, [], 1, 4, equal=True) == (None, [], "none")


def test_arrays_shard_x_and_the_others_row_by_row():
    x, y, w = np.arange(10).reshape(5, 2), np.arange(5), np.ones(5)
    got_x, (got_y, got_w, none), kind = sharding.shard_input(x, [y, w, None], 1, 2, equal=False)
    assert kind == "arrays" and none is None
    assert got_x.tolist() == [[2, 3], [6, 7]] and got_y.tolist() == [1, 3]
    assert got_w.tolist() == [1.0, 1.0]
    got_x, (got_y,), _ = sharding.shard_input(x, [y], 0, 2, equal=False)
    assert got_y.tolist() == [0, 2, 4]  # unequal: rank 0 keeps the odd row out
    got_x, (got_y,), _ = sharding.shard_input(x, [y], 0, 2, equal=True)
    assert got_y.tolist() == [0, 2, 4]  # training keeps it too (equal_steps evens the steps)


def test_datasets_generators_and_pydatasets_get_their_own_sharding():
    ds, (y,), kind = sharding.shard_input(tf.data.Dataset.range(9), ["y"], 2, 4, equal=False)
    assert kind == "dataset" and y == "y" and list(ds.as_numpy_iterator()) == [2, 6]
    ds, _, _ = sharding.shard_input(tf.data.Dataset.range(9), [], 2, 4, equal=True)
    assert list(ds.as_numpy_iterator()) == [2, 6]
    ds, _, _ = sharding.shard_input(tf.data.Dataset.range(9), [], 0, 4, equal=False)
    assert list(ds.as_numpy_iterator()) == [0, 4, 8]
    gen, _, kind = sharding.shard_input(iter(range(9)), [], 0, 4, equal=False)
    assert kind == "generator" and list(gen) == [0, 4, 8]
    py, others, kind = sharding.shard_input(Batches(9), [], 0, 4, equal=False)
    assert kind == "pydataset" and others == [] and isinstance(py, sharding.ShardedPyDataset)
    assert len(py) == 3 and [int(py[i][0][0, 0]) for i in range(3)] == [0, 4, 8]


def test_a_pydataset_too_short_for_the_ranks_is_refused_naming_the_counts():
    with pytest.raises(TransparentModeError, match="the PyDataset has 3 batches for 4 ranks"):
        sharding.shard_input(Batches(3), [], 0, 4, equal=True)
    short, _, _ = sharding.shard_input(Batches(3), [], 3, 4, equal=False)
    assert len(short) == 0


def test_a_dataset_too_short_for_the_ranks_is_refused_naming_the_counts():
    with pytest.raises(TransparentModeError, match="the dataset has 3 elements for 4 ranks"):
        sharding.shard_dataset(tf.data.Dataset.range(3), 0, 4, equal=True)
    unknown = tf.data.Dataset.range(3).filter(lambda v: v < 9)
    with pytest.raises(TransparentModeError, match="the dataset has too few elements for 4"):
        sharding.shard_dataset(unknown, 0, 4, equal=True, agree=lambda c: [0])
    endless = tf.data.Dataset.range(3).repeat()
    assert sharding.shard_dataset(endless, 1, 4, equal=True).cardinality() == (
        tf.data.INFINITE_CARDINALITY)


def test_the_sharded_pydataset_keeps_the_options_and_passes_epoch_ends_on():
    ends = []

    class Counting(Batches):
        def on_epoch_end(self):
            ends.append(1)

    base = Counting(8, workers=3, use_multiprocessing=False, max_queue_size=7)
    shard = sharding.ShardedPyDataset(base, 1, 3, equal=False)
    assert (shard.workers, shard.use_multiprocessing, shard.max_queue_size) == (3, False, 7)
    assert shard.num_batches == 3 and [int(shard[i][0][0, 0]) for i in range(3)] == [1, 4, 7]
    assert sharding.ShardedPyDataset(base, 1, 3, equal=True).num_batches == 2
    shard.on_epoch_end()
    assert ends == [1]


def test_rows_that_differ_are_refused_with_the_counts():
    with pytest.raises(TransparentModeError, match=r"different numbers of rows \[2, 3\]"):
        sharding.shard_arrays([{"a": np.ones(3), "b": np.ones(2)}], 0, 2, equal=True)
    with pytest.raises(TransparentModeError, match=r"Run on at most 3 ranks or pass more data"):
        sharding.shard_arrays([np.ones(3)], 0, 4, equal=True)
