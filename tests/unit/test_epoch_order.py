"""The order a transparent elastic ``fit`` trains array rows in when it commits between batches
(hpcrep/tensorflow/transparent/epoch_order.py): every row once per epoch over the ranks, also
across a change of the number of ranks mid-epoch, and served to Keras epoch by epoch."""

import keras
import numpy as np
import pytest

from hpcrep.tensorflow.transparent.epoch_order import EpochOrder, FollowEpochs, OrderedRows


def trained(order: EpochOrder, epoch: int, start_row: int, steps: int) -> list[int]:
    """The rows every rank trains in the first ``steps`` steps of ``epoch`` resumed after
    ``start_row`` rows (each rank's batches as :meth:`EpochOrder.rank_rows` gives them)."""
    rows = []
    for rank in range(order.size):
        mine = order.rank_rows(epoch, rank, start_row)
        taken = sum(min(order.batch_size, order.rows_per_rank(start_row) - s * order.batch_size)
                    for s in range(steps))
        rows.extend(mine[:taken].tolist())
    return rows


@pytest.mark.parametrize("rows,batch,size", [(128, 4, 4), (103, 5, 3), (50, 32, 2), (7, 2, 1)])
def test_an_epoch_trains_every_row_once_less_fewer_than_size(rows, batch, size):
    order = EpochOrder(rows, batch, size, seed=11, shuffle=True)
    got = trained(order, 3, 0, order.steps())
    assert len(got) == len(set(got)) == rows // size * size
    assert set(got) == set(order.permutation(3)[:rows // size * size].tolist())
    assert order.rows_after(0, order.steps()) == len(got)
    assert {len(order.rank_rows(3, r)) for r in range(size)} == {rows // size}


@pytest.mark.parametrize("before,after,steps", [(4, 3, 5), (3, 4, 2), (4, 1, 7), (2, 2, 3)])
def test_an_epoch_resumed_on_another_number_of_ranks_trains_each_remaining_row_once(
        before, after, steps):
    """The commit after ``steps`` steps on ``before`` ranks holds ``rows_after``; the epoch's
    rest on ``after`` ranks trains exactly the rows not trained yet (less fewer than ``after``
    at the end)."""
    first = EpochOrder(200, 6, before, seed=5, shuffle=True)
    done = trained(first, 2, 0, steps)
    start = first.rows_after(0, steps)
    assert start == len(done) == before * 6 * steps
    second = EpochOrder(200, 6, after, seed=5, shuffle=True)
    rest = trained(second, 2, start, second.steps(start))
    assert not set(done) & set(rest)
    assert len(rest) == len(set(rest)) == (200 - start) // after * after
    assert set(done) | set(rest) == set(first.permutation(2)[:start + len(rest)].tolist())


def test_the_order_is_the_seeds_and_changes_each_epoch_or_is_in_order_without_shuffle():
    a, b = EpochOrder(64, 4, 2, 1, True), EpochOrder(64, 4, 2, 1, True)
    np.testing.assert_array_equal(a.permutation(0), b.permutation(0))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert not np.array_equal(a.permutation(0), EpochOrder(64, 4, 2, 2, True).permutation(0))
    np.testing.assert_array_equal(EpochOrder(64, 4, 2, 1, False).permutation(5), np.arange(64))
    # global batch 0 of an ordered epoch: rank 0 the first 4 rows, rank 1 the next 4
    in_order = EpochOrder(64, 4, 2, 1, False)
    np.testing.assert_array_equal(in_order.rank_rows(0, 1)[:4], [4, 5, 6, 7])


class Served(OrderedRows):
    """Records which rows Keras reads, and in which epoch, from train begin on (building its
    tf.data pipeline, Keras reads the first batches once to learn their shapes)."""

    def __init__(self, *args, **kwargs):
        self.read: dict[int, list[int]] = {}
        super().__init__(*args, **kwargs)

    def __getitem__(self, index):
        batch = super().__getitem__(index)
        self.read.setdefault(self.epoch, []).extend(batch[0][:, 0].astype(int).tolist())
        return batch


def forget(data: Served) -> keras.callbacks.Callback:
    return keras.callbacks.LambdaCallback(on_train_begin=lambda logs=None: data.read.clear())


def test_keras_reads_each_epochs_own_rows_through_the_py_dataset():
    """A real ``fit`` over :class:`OrderedRows` (tf.data prefetches from it): each epoch reads
    exactly its own rows, a resumed first epoch only its rest."""
    x = np.stack([np.arange(40), np.linspace(0, 1, 40)], axis=1).astype("float32")
    y = x[:, 1:] * 2
    order = EpochOrder(40, 4, 2, seed=3, shuffle=True)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    data = Served((x, y), order, rank=1, first_epoch=1, start_row=8)
    model.fit(data, epochs=2, initial_epoch=1, shuffle=False, verbose=0,
              callbacks=[FollowEpochs(data), forget(data)])
    whole = Served((x, y), order, rank=1, first_epoch=2)
    model.fit(whole, epochs=5, initial_epoch=2, shuffle=False, verbose=0,
              callbacks=[FollowEpochs(whole), forget(whole)])
    assert data.read[1] == order.rank_rows(1, 1, 8).tolist()  # the rest of the epoch
    assert len(data.read[1]) == 16
    for epoch in (2, 3, 4):
        assert whole.read[epoch] == order.rank_rows(epoch, 1).tolist(), epoch
    assert whole.read[2] != whole.read[3]
