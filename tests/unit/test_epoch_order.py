"""The order a transparent elastic ``fit`` trains array rows in when it commits between batches
(hpcrep/tensorflow/transparent/epoch_order.py): every row once per epoch over the ranks, also
across a change of the number of ranks mid-epoch, and served to Keras epoch by epoch."""

import warnings

import keras
import numpy as np
import pytest

from hpcrep.tensorflow.transparent.epoch_order import EpochOrder, OrderedRows


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


def test_the_pipeline_yields_each_epochs_own_rows_and_a_resumed_epoch_its_rest():
    """:class:`OrderedRows`' dataset, read as ``fit`` reads it (``steps_per_epoch`` batches an
    epoch, on through the epochs): each epoch's batches hold exactly its own rows, in order."""
    x = np.stack([np.arange(42), np.linspace(0, 1, 42)], axis=1).astype("float32")
    y = x[:, 1:] * 2
    order = EpochOrder(42, 4, 2, seed=3, shuffle=True)
    rest = OrderedRows((x, y, None), order, rank=1, first_epoch=1, last_epoch=2, start_row=8)
    assert rest.num_batches == 5  # (42 - 8) // 2 = 17 rows: 4 + 4 + 4 + 4 + 1
    batches = list(rest.dataset.as_numpy_iterator())
    assert len(batches) == 5 and [len(b[0]) for b in batches] == [4, 4, 4, 4, 1]
    assert np.concatenate([b[0][:, 0] for b in batches]).astype(int).tolist() == \
        order.rank_rows(1, 1, 8).tolist()
    np.testing.assert_allclose(batches[0][1], batches[0][0][:, 1:] * 2)  # y follows x
    whole = OrderedRows((x, y), order, rank=1, first_epoch=2, last_epoch=5)
    assert whole.num_batches == 6 and whole.dataset.cardinality() == 18
    read = [b[0][:, 0].astype(int).tolist() for b in whole.dataset.as_numpy_iterator()]
    for k, epoch in enumerate((2, 3, 4)):
        got = sum(read[k * 6:(k + 1) * 6], [])
        assert got == order.rank_rows(epoch, 1).tolist(), epoch
    assert read[0] != read[6]
    with pytest.raises(ValueError, match="a fit of its own"):
        OrderedRows((x, y), order, rank=0, first_epoch=1, last_epoch=3, start_row=8)


def test_keras_fit_reads_the_epochs_through_steps_per_epoch():
    """A real ``fit`` over the pipeline (``steps_per_epoch=num_batches``) trains every epoch's
    batches: as many steps as the epochs have, and no data left unread or missing."""
    x = np.stack([np.arange(40), np.linspace(0, 1, 40)], axis=1).astype("float32")
    order = EpochOrder(40, 4, 2, seed=3, shuffle=True)
    data = OrderedRows((x, x[:, 1:] * 2), order, rank=0, first_epoch=0, last_epoch=3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns where the input ran out of data
        history = model.fit(data.dataset, steps_per_epoch=data.num_batches, epochs=3,
                            shuffle=False, verbose=0)
    assert len(history.epoch) == 3 and int(model.optimizer.iterations.numpy()) == 3 * 5
