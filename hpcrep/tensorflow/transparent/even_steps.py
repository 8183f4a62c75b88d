"""Every row of training arrays once per epoch, with equal step counts on every rank; a warning
with the count of whatever other input leaves out.

:func:`~.sharding.shard_arrays` gives rank ``r`` rows ``r, r + size, ...`` of all the rows:
``n // size`` or one more. Every rank must take the same number of steps (each exchanges
gradients), which :func:`equal_steps` ensures; the ranks then average their gradients, each
rank's the mean over its batch (as Keras takes a short last batch in one process), so a step
where the ranks' batches differ by a row weighs the rows of the smaller batches slightly more
than one process taking them in one batch would.

Datasets, generators and ``PyDataset``s are cut by whole batches (:mod:`.sharding`): the last
batches that do not share out are left out, and :func:`warn_left_out` says how many, on rank 0.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import tensorflow as tf


def equal_steps(x: Any, y: Any, sample_weight: Any, total: int, rank: int, size: int,
                batch_size: int, can_weight: bool = True) -> tuple[Any, Any, Any]:
    """Even out the steps of rank ``rank``'s rows of :func:`shard_arrays` (``x``, ``y``,
    ``sample_weight``, of ``total`` rows in all) for batches of ``batch_size`` rows.

    Ranks hold ``total // size`` rows or one more; when ``total // size`` is a whole number of
    batches, the ranks with fewer rows would take one step less and leave the others waiting in
    a gradient exchange. Such a rank gets one more row: a copy of its first row with sample
    weight 0 (weights of 1 for its own rows, unless given), so it takes the step and its copy
    adds nothing to any loss or weighted metric; the batch the copy lands in counts it in its
    size, so that batch's gradient is its real rows' times ``(b - 1) / b``. Where weights
    cannot be added (``can_weight`` False: Keras refuses ``class_weight`` with
    ``sample_weight``), the ranks with one more row leave their last row out instead, with a
    warning on rank 0. Local.
    """
    most, rows = -(-total // size), len(range(rank, total, size))
    if total % size == 0 or (most - 1) % batch_size != 0 or total < size:
        return x, y, sample_weight
    if not can_weight:
        if rank == 0:
            warn_left_out(f"{total % size} row(s) of the {total}", total % size, size,
                          "with class_weight, rows cannot be padded with a zero-weight copy")
        cut = (lambda a: a[:most - 1]) if rows == most else (lambda a: a)
        return tuple(None if s is None else tf.nest.map_structure(cut, s)
                     for s in (x, y, sample_weight))
    if rows == most:
        return x, y, (np.ones(rows, np.float32) if sample_weight is None else sample_weight)

    def pad(a: Any) -> Any:
        return np.concatenate([np.asarray(a), np.asarray(a)[:1]])

    weights = np.ones(rows, np.float32) if sample_weight is None else sample_weight
    return (tf.nest.map_structure(pad, x), None if y is None else tf.nest.map_structure(pad, y),
            tf.nest.map_structure(
                lambda a: np.concatenate([np.asarray(a), np.zeros_like(np.asarray(a)[:1])]),
                weights))


def warn_left_out(what: str, count: int, size: int, why: str = "") -> None:
    """Warn that ``what`` (``count`` items) of an epoch's input is left out of training. Local:
    call it on one rank."""
    warnings.warn(
        f"hpcrep transparent mode: {what} are left out of every epoch of training: every rank "
        f"must take the same number of steps, and these {count} do not share out evenly among "
        f"{size} ranks{'; ' + why if why else ''}. To train on every row, pass numpy arrays, "
        "or give the input a number of batches that is a multiple of the number of ranks.",
        UserWarning, stacklevel=3)


def rows_in(items: Sequence[Any]) -> int:
    """Rows of a sequence of batches: the leading dimension of each one's first array."""
    rows = 0
    for item in items:
        leaf = tf.nest.flatten(item)[0]
        rows += int(np.shape(leaf)[0]) if np.ndim(leaf) else 1
    return rows


def dataset_rows(ds: tf.data.Dataset) -> int:
    """Rows of the elements of ``ds``: the leading dimension of each one's first tensor (1 for a
    scalar). Reads ``ds`` once. Local."""
    def add(total: tf.Tensor, element: Any) -> tf.Tensor:
        leaf = tf.nest.flatten(element)[0]
        rows = tf.shape(leaf, out_type=tf.int64)[0] if leaf.shape.rank else tf.constant(1, tf.int64)
        return total + rows

    return int(ds.reduce(np.int64(0), add))
