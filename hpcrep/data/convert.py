"""Write arrays to HDF5 files chunked for :class:`hpcrep.data.reader.HDF5ShardReader`.

Sources: ``.npz`` archives (one dataset per array), ``.npy`` files (one dataset named after the
file), and Debian's ``dataset-fashion-mnist`` IDX files (``x_train``, ``y_train``, ``x_test``,
``y_test``; read by :mod:`hpcrep.data.mnist`). Chunks hold ``chunk_rows`` whole rows, so a
batch-aligned slice touches few chunks.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import h5py
import numpy as np

from hpcrep.errors import DataError


def load_arrays(path: str, name: Optional[str] = None) -> dict[str, np.ndarray]:
    """Return the arrays of a ``.npz`` or ``.npy`` file (never unpickling objects)."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if path.endswith(".npy"):
        return {name or os.path.splitext(os.path.basename(path))[0]:
                np.load(path, allow_pickle=False)}
    raise DataError(f"{path}: expected a .npz or .npy file")


def write_hdf5(path: str, arrays: Mapping[str, np.ndarray], chunk_rows: int = 256,
               shuffle_seed: Optional[int] = None, compression: Optional[str] = None) -> None:
    """Write ``arrays`` (equal first dimension if more than one) to ``path``, chunked by rows.

    ``shuffle_seed`` permutes the rows (the same permutation for every array) once, here, so
    that readers can use cheap block shuffling later.
    """
    if chunk_rows < 1:
        raise DataError(f"chunk_rows must be >= 1; got {chunk_rows}")
    rows = {k: (a.shape[0] if a.ndim else 0) for k, a in arrays.items()}
    if not arrays or 0 in rows.values():
        raise DataError(f"need arrays with at least one row each; got {rows}")
    perm = None
    if shuffle_seed is not None:
        if len(set(rows.values())) != 1:
            raise DataError(f"--shuffle needs arrays of equal row counts; got {rows}")
        perm = np.random.default_rng(shuffle_seed).permutation(next(iter(rows.values())))
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        for key, a in arrays.items():
            a = a[perm] if perm is not None else a
            chunks = (min(chunk_rows, a.shape[0]),) + a.shape[1:]
            f.create_dataset(key, data=a, chunks=chunks, compression=compression)
    os.replace(tmp, path)
