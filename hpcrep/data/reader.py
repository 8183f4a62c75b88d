"""Per-rank contiguous, batch-aligned shards of HDF5 datasets, read as slices.

With ``n`` rows, batch ``b`` and ``size`` ranks, every rank gets ``steps = n // (b * size)``
batches: rank ``r`` owns rows ``[r*steps*b, (r+1)*steps*b)`` (the remainder is dropped, so every
rank runs the same number of steps and no collective waits on a rank that ran out). Each batch
is one contiguous slice ``ds[a:a+b]``: h5py reads a slice with one hyperslab selection, while
fancy indexing on chunked data is about 100x slower on these machines (bench/hdf5_io.py). Shuffling
permutes the order of the shard's batch-sized blocks with a seed derived from
``(seed, epoch, rank)``: a different order each epoch, reproducible on resume. Rows within a
block keep their order; convert with shuffled rows (``hpcrep data convert --shuffle``) if the
source is sorted.

The file is opened lazily by the process that iterates, never shared across processes.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence

import h5py
import numpy as np

from hpcrep.errors import DataError


@dataclasses.dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of a rank, as ``steps`` batches of ``batch_size``."""

    start: int
    stop: int
    steps: int
    batch_size: int


def shard_for(rows: int, batch_size: int, rank: int, size: int) -> Shard:
    """Return rank ``rank``'s contiguous, batch-aligned shard of ``rows`` rows.

    Raises:
        DataError: bad arguments, or fewer rows than one batch per rank.
    """
    if batch_size < 1 or size < 1 or not 0 <= rank < size:
        raise DataError(f"need batch_size >= 1 and 0 <= rank < size; got batch_size="
                        f"{batch_size}, rank={rank}, size={size}")
    steps = rows // (batch_size * size)
    if steps == 0:
        raise DataError(f"{rows} rows are fewer than one batch of {batch_size} for each of "
                        f"{size} ranks ({batch_size * size} rows); use a smaller batch")
    start = rank * steps * batch_size
    return Shard(start, start + steps * batch_size, steps, batch_size)


def block_order(steps: int, epoch: int, seed: int, rank: int, shuffle: bool) -> np.ndarray:
    """Return the order of the shard's batch blocks in ``epoch`` (identity without shuffle)."""
    if not shuffle:
        return np.arange(steps)
    return np.random.default_rng([seed, epoch, rank]).permutation(steps)


class HDF5ShardReader:
    """Read this rank's shard of datasets ``keys`` of an HDF5 file, batch by batch.

    Args:
        path: the HDF5 file (``hpcrep data convert`` writes ones chunked by rows).
        keys: dataset names; all must have the same number of rows.
        batch_size: rows per batch (per rank).
        rank, size: this rank and the world size (default: from :mod:`hpcrep.comm` if
            initialised, else 0 and 1).
        shuffle: permute the order of batch blocks each epoch.
        seed: the shuffling seed (the same on every rank).
    """

    def __init__(self, path: str, keys: Sequence[str], batch_size: int,
                 rank: Optional[int] = None, size: Optional[int] = None, shuffle: bool = True,
                 seed: int = 0) -> None:
        if rank is None or size is None:
            from hpcrep import comm  # noqa: PLC0415 - MPI only when no rank is given
            initialised = comm.is_initialized()
            rank = comm.rank() if initialised else 0
            size = comm.size() if initialised else 1
        self.path, self.keys = path, list(keys)
        self.rank, self.size, self.shuffle, self.seed = rank, size, shuffle, int(seed)
        if not self.keys:
            raise DataError("give at least one dataset name in keys")
        with h5py.File(path, "r") as f:
            missing = [k for k in self.keys if k not in f]
            if missing:
                raise DataError(f"{path} has no dataset {missing}; it has {sorted(f.keys())}")
            rows = {k: f[k].shape[0] for k in self.keys}
            self.specs = {k: (f[k].shape[1:], f[k].dtype) for k in self.keys}
        if len(set(rows.values())) != 1:
            raise DataError(f"datasets of {path} differ in rows: {rows}; expected equal counts")
        self.rows = next(iter(rows.values()))
        self.shard = shard_for(self.rows, batch_size, rank, size)
        self._file: Optional[h5py.File] = None

    @property
    def steps_per_epoch(self) -> int:
        """Batches each rank reads per epoch (equal on every rank)."""
        return self.shard.steps

    def batches(self, epoch: int = 0, start_step: int = 0) -> Iterator[tuple[np.ndarray, ...]]:
        """Yield this rank's batches of ``epoch`` from step ``start_step`` (to resume mid-epoch)."""
        if self._file is None:
            self._file = h5py.File(self.path, "r")
        datasets = [self._file[k] for k in self.keys]
        b = self.shard.batch_size
        for block in block_order(self.shard.steps, epoch, self.seed, self.rank,
                                 self.shuffle)[start_step:]:
            a = self.shard.start + int(block) * b
            yield tuple(ds[a:a + b] for ds in datasets)

    def close(self) -> None:
        """Close the file (it reopens on the next :meth:`batches`)."""
        if self._file is not None:
            self._file.close()
            self._file = None
