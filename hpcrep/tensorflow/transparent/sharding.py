"""Split ``fit``/``evaluate``/``predict`` inputs by rank, and put predictions back in order.

Training inputs are cut so that every rank runs the same number of steps (a collective step
count is what keeps the gradient exchanges paired): arrays keep every row, rows ``rank, rank +
size, ...`` (:func:`.even_steps.equal_steps` then evens out the step counts); ``tf.data``
datasets keep every ``size``-th element (a batch, for a batched dataset) and
``cardinality // size`` of them; Python generators and ``PyDataset`` deal items round-robin in
groups of ``size`` (an incomplete last group is left out). What a dataset, generator or
``PyDataset`` leaves out (at most ``size - 1`` batches an epoch) is counted in a warning on
rank 0 (:func:`.even_steps.warn_left_out`), never silently. Every rank still runs the generator
in full, so it must produce the same sequence on every rank. The batch size stays per rank (weak
scaling). ``evaluate`` takes uneven shares (:mod:`.predict_share`).

An input with fewer elements than ranks (but at least one) cannot be cut so: it raises
:class:`~hpcrep.errors.TransparentModeError` on every rank, or (``whole_if_short``) is used whole
on every rank.

Prediction inputs are cut the same way without dropping anything (:mod:`.predict_share`, which
also covers ranks left with nothing); :func:`gather_predictions` reassembles the full result, in
the original order, on every rank.

A ``tf.data`` dataset that is already this rank's shard is never cut: one whose
``options().experimental_distribute.auto_shard_policy`` is
``tf.data.experimental.AutoShardPolicy.OFF`` (see :mod:`hpcrep.tensorflow.presharded`), as
:func:`hpcrep.tensorflow.hdf5_dataset.hdf5_dataset` returns, or a dataset derived from one
(options travel through ``map``, ``batch``, ``prefetch`` ...). Shard your own input and set
that option to opt out. ``fit`` and ``evaluate`` use such a dataset whole, after the ranks have
checked that they all hold the same number of elements (:func:`check_presharded`; a difference
raises :class:`~hpcrep.errors.TransparentModeError` on every rank instead of leaving a rank
waiting in a gradient exchange); ``predict`` returns this rank's predictions of its own shard,
not gathered.

Functions take ``rank`` and ``size`` so they can be tested in one process; only
:func:`gather_counts` (for datasets of unknown length and pre-sharded datasets) communicates.
"""

from __future__ import annotations

import itertools
import types
from typing import Any, Callable, Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.errors import TransparentModeError
from hpcrep.tensorflow.presharded import is_presharded
from hpcrep.tensorflow.transparent.even_steps import dataset_rows, rows_in, warn_left_out

Kind = str  # "none" | "arrays" | "dataset" | "presharded" | "pydataset" | "generator"


def kind_of(x: Any) -> Kind:
    """Classify a Keras input: ``none``, ``dataset``, ``presharded`` (a dataset marked as this
    rank's shard already), ``pydataset``, ``generator`` or ``arrays``."""
    if x is None:
        return "none"
    if isinstance(x, tf.data.Dataset):
        return "presharded" if is_presharded(x) else "dataset"
    if isinstance(x, keras.utils.PyDataset):
        return "pydataset"
    if (isinstance(x, (types.GeneratorType, Iterator))
            and not isinstance(x, (np.ndarray, tf.Tensor))):
        return "generator"
    return "arrays"


def first_rows(x: Any, y: Any = None, sample_weight: Any = None) -> Optional[tuple]:
    """Return a data batch of ``fit``'s input, ``(x, y, sample_weight)`` less trailing Nones (the
    first row of arrays; the first element of a dataset), to build a model symbolically; None
    for inputs that cannot be read without consuming them (generators, PyDatasets) or that are
    empty. Local."""
    kind = kind_of(x)
    if kind == "arrays":
        if count_rows(x) == 0:
            return None
        batch = tuple(None if v is None else tf.nest.map_structure(lambda a: a[:1], v)
                      for v in (x, y, sample_weight))
        while batch and batch[-1] is None:
            batch = batch[:-1]
        return batch
    if kind in ("dataset", "presharded"):
        for element in x.take(1):
            return element if isinstance(element, tuple) else (element,)
    return None


def count_rows(structure: Any) -> int:
    """Return the number of rows of every array in ``structure`` (one count). Local."""
    lengths = {int(np.shape(leaf)[0]) for leaf in tf.nest.flatten(structure)}
    if len(lengths) != 1:
        raise TransparentModeError(
            f"input arrays have different numbers of rows {sorted(lengths)}; expected one count "
            "for x, y and sample_weight. Pass arrays of equal length.")
    return lengths.pop()


def shard_arrays(structures: Sequence[Any], rank: int, size: int, equal: bool) -> list[Any]:
    """Return rows ``rank::size`` of each structure (``None`` entries stay ``None``): every row
    once, ``n // size`` or one more per rank.

    With ``equal`` (training), an input of fewer rows than ranks raises.
    Local: every rank knows ``n``.
    """
    present = [s for s in structures if s is not None]
    if not present:
        return list(structures)
    n = {count_rows(s) for s in present}
    if len(n) != 1:
        raise TransparentModeError(
            f"x, y and sample_weight have different numbers of rows {sorted(n)}; expected equal "
            "counts. Pass arrays of equal length.")
    total = n.pop()
    if equal and total < size:
        raise TransparentModeError(
            f"{total} rows cannot be shared by {size} ranks (each needs at least one). Run on at "
            f"most {total} ranks or pass more data.")
    return [None if s is None else tf.nest.map_structure(lambda a: a[rank::size], s)
            for s in structures]


def gather_counts(local: int) -> list[int]:
    """Return every rank's ``local`` count, in rank order. Collective."""
    return [int(c) for c in comm.allgather(np.array([local], np.int64), name="shard_lengths")]


def _length(count: int) -> str:
    return {tf.data.INFINITE_CARDINALITY: "infinite"}.get(count, str(count))


def check_presharded(ds: tf.data.Dataset, equal: bool,
                     gather: Callable[[int], list[int]] = gather_counts) -> tf.data.Dataset:
    """Return ``ds``, already this rank's shard, unchanged; with ``equal``, first check that every
    rank's shard has the same number of elements (steps).

    A shard of unknown length is counted once (one pass). Infinite shards pass when every rank's
    is infinite (``steps_per_epoch`` then sets the steps).

    Collective when ``equal`` (``gather``): every rank must call this, in the same order.

    Raises:
        TransparentModeError: on every rank, when the ranks' lengths differ or are zero.
    """
    if not equal:
        return ds
    local = int(ds.cardinality())
    if local == tf.data.UNKNOWN_CARDINALITY:
        local = int(ds.reduce(np.int64(0), lambda c, _: c + 1))
    counts = gather(local)
    if len(set(counts)) > 1:
        ranks: dict[int, list[int]] = {}
        for r, c in enumerate(counts):
            ranks.setdefault(c, []).append(r)
        found = "; ".join(f"{_length(c)} on rank(s) {rs}" for c, rs in sorted(ranks.items()))
        raise TransparentModeError(
            f"a dataset marked as already sharded (tf.data auto_shard_policy OFF) has different "
            f"numbers of elements on different ranks: {found}. Expected the same number on every "
            "rank: each training step exchanges gradients among all ranks, so a rank that runs "
            "out first would leave the others waiting. Give every rank's shard the same length "
            "(e.g. .take(n) with the smallest count), or leave auto_shard_policy unset so that "
            "hpcrep shards the whole dataset itself.")
    if counts[0] == 0:
        raise TransparentModeError(
            "a dataset marked as already sharded (tf.data auto_shard_policy OFF) is empty on "
            "every rank; each rank needs at least one batch. Check the input (or use a smaller "
            "batch size).")
    return ds


def shard_dataset(ds: tf.data.Dataset, rank: int, size: int, equal: bool,
                  agree: Callable[[int], list[int]] = gather_counts,
                  whole_if_short: bool = False) -> tf.data.Dataset:
    """Return every ``size``-th element of ``ds`` from ``rank``, the same count on every rank.

    A dataset of unknown length is counted once (one pass over this rank's shard) and the ranks
    take the smallest of their counts (``agree`` gathers them, collective). Elements left out
    (at most ``size - 1``) are counted in a warning on rank 0, which reads them to count their
    rows. Infinite datasets are left infinite
    (``steps_per_epoch`` then sets the steps, equal on every rank). A dataset with fewer
    elements than ranks (but at least one) raises, or with ``whole_if_short`` comes back whole,
    on every rank alike.

    Raises:
        TransparentModeError: on every rank, when ``equal`` and the dataset has fewer elements
            than ranks (at least one, with ``whole_if_short``).
    """
    shard = ds.shard(size, rank)
    if not equal:
        return shard
    cardinality = int(ds.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return shard
    if cardinality == tf.data.UNKNOWN_CARDINALITY:
        counts = agree(int(shard.reduce(np.int64(0), lambda c, _: c + 1)))
        count, left_out = min(counts), sum(counts) - min(counts) * len(counts)
    else:
        count, left_out = cardinality // size, cardinality % size
    if count == 0 and whole_if_short and (cardinality > 0 or (
            cardinality == tf.data.UNKNOWN_CARDINALITY and not is_empty(ds))):
        return ds
    if count == 0:
        raise TransparentModeError(
            f"the dataset has {cardinality if cardinality >= 0 else 'too few'} elements for "
            f"{size} ranks; each rank needs at least one batch. Use a smaller batch size or "
            "fewer ranks.")
    if left_out and rank == 0:
        warn_left_out(f"the dataset's last {left_out} element(s) "
                      f"({dataset_rows(ds.skip(count * size))} rows)", left_out, size)
    return shard.take(count)


def is_empty(ds: tf.data.Dataset) -> bool:
    """Return True if ``ds`` has no element (reads at most one). Local."""
    cardinality = int(ds.cardinality())
    if cardinality != tf.data.UNKNOWN_CARDINALITY:
        return cardinality == 0
    return int(ds.take(1).reduce(np.int64(0), lambda c, _: c + 1)) == 0


def shard_generator(gen: Any, rank: int, size: int, equal: bool,
                    whole_if_short: bool = False) -> Iterator:
    """Yield item ``rank`` of each group of ``size`` items of ``gen`` (round-robin).

    With ``equal``, a generator of fewer items than ranks (at least one) raises on every rank
    when the first item is asked for, or with ``whole_if_short`` yields them all on every rank.

    Raises:
        TransparentModeError: as said, on every rank alike (every rank runs the same generator).
    """
    iterator = iter(gen)
    first = True
    while True:
        group = list(itertools.islice(iterator, size))
        if first and equal and 0 < len(group) < size:
            if whole_if_short:
                yield from group
                return
            raise TransparentModeError(
                f"the generator yielded {len(group)} item(s) for {size} ranks; each rank needs at "
                f"least one. Use smaller batches, more data or at most {len(group)} ranks.")
        first = False
        if equal and 0 < len(group) < size and rank == 0:
            warn_left_out(f"the generator's last {len(group)} item(s) ({rows_in(group)} rows)",
                          len(group), size)
        if not group or (equal and len(group) < size):
            return
        if rank < len(group):
            yield group[rank]
        elif equal:
            return


class ShardedPyDataset(keras.utils.PyDataset):
    """Batches ``rank, rank + size, ...`` of a ``PyDataset`` (equal counts when ``equal``)."""

    def __init__(self, base: keras.utils.PyDataset, rank: int, size: int, equal: bool) -> None:
        super().__init__(workers=base.workers, use_multiprocessing=base.use_multiprocessing,
                         max_queue_size=base.max_queue_size)
        self.base, self.rank, self.size, self.equal = base, rank, size, equal

    @property
    def num_batches(self) -> Optional[int]:
        total = self.base.num_batches
        if total is None:
            return None
        if self.equal:
            return total // self.size
        return len(range(self.rank, total, self.size))

    def __len__(self) -> int:
        return int(self.num_batches or 0)

    def __getitem__(self, index: int) -> Any:
        return self.base[index * self.size + self.rank]

    def on_epoch_end(self) -> None:
        self.base.on_epoch_end()


def shard_input(x: Any, others: Sequence[Any], rank: int, size: int, equal: bool,
                whole_if_short: bool = False) -> tuple[Any, list[Any], Kind]:
    """Shard ``x`` (and, for arrays, ``others`` such as ``y`` and ``sample_weight``).

    Returns ``(x, others, kind)``; a ``presharded`` dataset comes back unchanged. With ``equal``,
    an input of fewer rows (or batches, items) than ranks, but at least one, raises
    :class:`~hpcrep.errors.TransparentModeError` on every rank, or with ``whole_if_short``
    comes back whole on every rank (``evaluate``: each rank then computes the one-rank result).
    Collective for datasets of unknown length and, with ``equal``, for ``presharded`` datasets.
    """
    kind = kind_of(x)
    if size == 1 or kind == "none":
        return x, list(others), kind
    if kind == "arrays":
        if equal and whole_if_short and 0 < count_rows(x) < size:
            return x, list(others), kind
        out = shard_arrays([x, *others], rank, size, equal)
        return out[0], out[1:], kind
    if kind == "dataset":
        return (shard_dataset(x, rank, size, equal, whole_if_short=whole_if_short), list(others),
                kind)
    if kind == "presharded":
        return check_presharded(x, equal), list(others), kind
    if kind == "pydataset":
        sharded = ShardedPyDataset(x, rank, size, equal)
        if equal and not sharded.num_batches and x.num_batches is not None:
            if whole_if_short and x.num_batches > 0:
                return x, list(others), kind
            raise TransparentModeError(
                f"the PyDataset has {x.num_batches} batches for {size} ranks; each rank needs at "
                "least one. Use smaller batches or fewer ranks.")
        left_out = 0 if x.num_batches is None or not equal else x.num_batches % size
        if left_out and rank == 0:
            last = range(x.num_batches - left_out, x.num_batches)
            warn_left_out(f"the PyDataset's last {left_out} batch(es) "
                          f"({rows_in([x[i] for i in last])} rows)", left_out, size)
        return sharded, list(others), kind
    return shard_generator(x, rank, size, equal, whole_if_short), list(others), kind


def interleave(parts: Sequence[np.ndarray], pieces: Sequence[Sequence[int]]) -> np.ndarray:
    """Merge per-rank results back into the original order.

    ``parts[k]`` holds rank k's rows; ``pieces[k]`` the sizes of its consecutive pieces (rows
    for sharded arrays, batches for datasets). Piece ``j`` of rank ``k`` was global piece
    ``j * size + k``.
    """
    size = len(parts)
    split = [np.split(p, np.cumsum(s)[:-1]) if len(s) else [] for p, s in zip(parts, pieces)]
    ordered = []
    for j in range(max((len(s) for s in split), default=0)):
        for k in range(size):
            if j < len(split[k]):
                ordered.append(split[k][j])
    if not ordered:
        return parts[0]
    return np.concatenate(ordered)


def gather_predictions(outputs: Any, pieces: Optional[Sequence[int]]) -> Any:
    """Return every rank's predictions merged in the original input order, on every rank.

    ``pieces`` are this rank's batch sizes for sharded datasets and generators (see
    :func:`interleave`), or ``None`` for arrays sharded row by row (rank k held rows k::size).

    Collective: every rank must call this, in the same order, with outputs of the same structure.
    """
    all_pieces = None if pieces is None else comm.allgather_object(list(pieces))
    merged = []
    for i, leaf in enumerate(tf.nest.flatten(outputs)):
        gathered, rows = comm.allgatherv(np.ascontiguousarray(leaf), name=f"predict.{i}")
        parts = np.split(np.array(gathered), np.cumsum(rows)[:-1])
        if all_pieces is None:
            out = np.empty_like(np.array(gathered))
            for k, part in enumerate(parts):
                out[k::len(parts)] = part
            merged.append(out)
        else:
            merged.append(interleave(parts, all_pieces))
    return tf.nest.pack_sequence_as(outputs, merged)
