"""Write arrays to HDF5 files chunked for :class:`hpcrep.data.reader.HDF5ShardReader`.

Sources: ``.npz`` archives (one dataset per array), ``.npy`` files (one dataset named after the
file), and Debian's ``dataset-fashion-mnist`` IDX files (``x_train``, ``y_train``, ``x_test``,
``y_test``; ``dpkg -L dataset-fashion-mnist``). Chunks hold ``chunk_rows`` whole rows, so a
batch-aligned slice touches few chunks.
"""

from __future__ import annotations

import gzip
import os
from typing import Mapping, Optional

import h5py
import numpy as np

from hpcrep.errors import DataError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (optionally gzipped), the format of MNIST and Fashion-MNIST."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic {data[:4]!r})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    array = np.frombuffer(data, dtype, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {dims}, found {array.size} values (truncated?)")
    return array.reshape(dims).astype(dtype.newbyteorder("="))


def load_fashion_mnist(directory: str = FASHION_MNIST_DIR) -> dict[str, np.ndarray]:
    """Return Fashion-MNIST as ``x_train`` (60000, 28, 28) uint8, ``y_train``, ``x_test``,
    ``y_test``.

    Raises:
        DataError: the files are missing (install Debian's ``dataset-fashion-mnist``).
    """
    names = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
    out = {}
    for key, stem in names.items():
        path = next((p for p in (os.path.join(directory, stem + ".gz"),
                                 os.path.join(directory, stem)) if os.path.exists(p)), None)
        if path is None:
            raise DataError(f"Fashion-MNIST file {stem}(.gz) not found in {directory}; install it "
                            "with apt-get install dataset-fashion-mnist or pass its directory")
        out[key] = read_idx(path)
    return out


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
