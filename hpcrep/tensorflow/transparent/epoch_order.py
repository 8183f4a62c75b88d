"""The order in which a transparent ``fit`` trains array rows when it commits between batches
(``HPCREP_ELASTIC_BATCHES_PER_COMMIT``): hpcrep orders each epoch itself, so that a commit can
say which rows the epoch has trained, and a ``fit`` resumed from it (after a shrink, or a
relaunch at another number of ranks) trains each of the others exactly once.

Keras shuffles arrays itself, in an order hpcrep cannot see; here the order of epoch ``e`` is
TensorFlow's stateless shuffle of the rows with the seed ``(seed, e)`` (the seed is the same on
every rank and is committed; a relaunch with another TensorFlow version may order the rest of
an epoch otherwise, which still trains each of its rows once), or the rows in order where
``fit`` was given ``shuffle=False``. An epoch resumed after row ``d``
of that order trains rows ``d, d + 1, ...`` in global batches of ``size x batch_size`` rows,
rank ``r`` taking the ``r``-th slice of each: ``m = (rows - d) // size`` rows per rank (at most
``size - 1`` rows are dropped, which a fit that is not elastic keeps), the last batch of each
rank ``m % batch_size`` rows. After ``k`` steps the epoch has trained its first
``d + size x min(k x batch_size, m)`` rows (:meth:`EpochOrder.rows_after`), on every rank alike.

:class:`OrderedRows` is the ``tf.data`` pipeline a rank's ``fit`` reads those rows from (the
rows gathered in the pipeline: a Python ``PyDataset`` doubled the step time of a small model).
:class:`EpochOrder` takes the number of ranks and a rank as arguments, so that it can be
tested in one process. Nothing here communicates; :mod:`.elastic_fit` uses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from hpcrep.errors import TransparentModeError


class EpochOrder:
    """Which rows each rank trains in each step of each epoch (see the module's docstring)."""

    def __init__(self, rows: int, batch_size: int, size: int, seed: int, shuffle: bool) -> None:
        if batch_size < 1:
            raise TransparentModeError(f"batch_size {batch_size} is not a positive number of "
                                       "rows; pass batch_size >= 1 to fit.")
        self.rows, self.batch_size, self.size = rows, batch_size, size
        self.seed, self.shuffle = seed, shuffle

    def permutation(self, epoch: int) -> np.ndarray:
        """Return the order of the rows in ``epoch``, the same on every rank."""
        return self.permutation_tensor(epoch).numpy()

    def permutation_tensor(self, epoch: Any) -> tf.Tensor:
        """:meth:`permutation` as a tensor (``epoch`` an int, or a scalar tensor inside a
        ``tf.data`` pipeline): TensorFlow's stateless shuffle of ``(seed, epoch)``, so that the
        pipeline computes it without Python."""
        rows = tf.range(self.rows, dtype=tf.int64)
        if not self.shuffle:
            return rows
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(epoch, tf.int64)])
        return tf.random.experimental.stateless_shuffle(rows, seed=seed)

    def rank_rows_tensor(self, epoch: Any, rank: int, start_row: int = 0) -> tf.Tensor:
        """:meth:`rank_rows` as TensorFlow ops (``epoch`` may be a tensor, inside the pipeline):
        the whole global batches' r-th slices, then the r-th slice of the last, shorter one."""
        remaining = self.permutation_tensor(epoch)[start_row:]
        per_rank, batch, size = self.rows_per_rank(start_row), self.batch_size, self.size
        full, last = divmod(per_rank, batch)  # whole batches, then one of ``last`` rows
        whole = tf.reshape(remaining[:full * size * batch], [full, size, batch])[:, rank, :]
        tail = remaining[full * size * batch + rank * last:full * size * batch + (rank + 1) * last]
        return tf.concat([tf.reshape(whole, [-1]), tail], axis=0)

    def rows_per_rank(self, start_row: int) -> int:
        """Return how many rows each rank trains in an epoch resumed after ``start_row`` rows."""
        return max(self.rows - start_row, 0) // self.size

    def steps(self, start_row: int = 0) -> int:
        """Return the number of steps of an epoch resumed after ``start_row`` rows."""
        return -(-self.rows_per_rank(start_row) // self.batch_size)

    def rows_after(self, start_row: int, steps: int) -> int:
        """Return how many rows of the epoch's order are trained once ``steps`` steps of an
        epoch resumed after ``start_row`` rows have run (on every rank)."""
        return start_row + self.size * min(steps * self.batch_size,
                                           self.rows_per_rank(start_row))

    def rank_rows(self, epoch: int, rank: int, start_row: int = 0) -> np.ndarray:
        """Return the indices of the rows ``rank`` trains in ``epoch`` resumed after
        ``start_row`` rows, in the order of its batches."""
        return self.rank_rows_tensor(epoch, rank, start_row).numpy()


class OrderedRows:
    """A rank's array input in :class:`EpochOrder`'s order, for ``fit``: :attr:`dataset` yields
    its batches of ``(x, y, sample_weight)`` (less trailing Nones; each a structure of arrays
    indexed by row) epoch after epoch, from ``first_epoch`` (resumed after ``start_row`` rows)
    up to ``last_epoch`` (exclusive), :attr:`num_batches` batches an epoch: give ``fit`` both
    (``steps_per_epoch=num_batches``: Keras then reads on through the epochs). A resumed first
    epoch has fewer batches than whole ones, so it must be a ``fit`` of its own
    (``last_epoch = first_epoch + 1``).

    The pipeline is TensorFlow ops only, built as Keras builds its own for arrays: each epoch's
    order computed once, when the pipeline reaches it, and the rows gathered in a parallel map.
    Local."""

    def __init__(self, arrays: tuple, order: EpochOrder, rank: int, first_epoch: int,
                 last_epoch: int, start_row: int = 0) -> None:
        arrays = tuple(arrays)
        while arrays and arrays[-1] is None:
            arrays = arrays[:-1]
        if start_row and last_epoch != first_epoch + 1:
            raise ValueError("an epoch resumed mid-way has fewer batches than the others: "
                             "give it a fit of its own (last_epoch = first_epoch + 1)")
        self.order, self.rank = order, rank
        self.first_epoch, self.last_epoch, self.start_row = first_epoch, last_epoch, start_row
        self.num_batches = order.steps(start_row)
        self.dataset = self._pipeline(arrays)

    def _pipeline(self, arrays: tuple) -> tf.data.Dataset:
        tensors = tuple(tf.nest.map_structure(tf.convert_to_tensor, a) for a in arrays)

        def batches_of(epoch: tf.Tensor) -> tf.data.Dataset:
            rows = self.order.rank_rows_tensor(epoch, self.rank, self.start_row)
            return tf.data.Dataset.from_tensor_slices(rows).batch(self.order.batch_size)

        def gather(rows: tf.Tensor, data: tuple) -> tuple:
            return tf.nest.map_structure(lambda v: tf.gather(v, rows), data)

        # The arrays enter as a dataset element, as Keras's own array adapter feeds them.
        batches = tf.data.Dataset.range(self.first_epoch, self.last_epoch).flat_map(batches_of)
        whole = tf.data.Dataset.from_tensors(tensors).repeat()
        dataset = tf.data.Dataset.zip((batches, whole)).map(gather, num_parallel_calls=2)
        total = self.num_batches * max(self.last_epoch - self.first_epoch, 0)
        options = tf.data.Options()
        # Without tf.data's autotuning thread: deleting the iterator at the end of fit waited
        # for that thread's next wake-up (3-4 s in about half of the 2-rank runs; TF 2.21, as
        # tests/mpi/test_replicator.py found for its datasets).
        options.autotune.enabled = False
        return dataset.apply(tf.data.experimental.assert_cardinality(total)).prefetch(
            2).with_options(options)
