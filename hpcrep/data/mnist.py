"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (offline, MIT licence): the one
loader every job, example and the converter use. numpy only.

The package installs the four IDX files under :data:`FASHION_MNIST_DIR`
(``dpkg -L dataset-fashion-mnist``); nothing is downloaded.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from hpcrep.errors import DataError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_STEMS = {"train": "train", "test": "t10k"}


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


def fashion_mnist_split(split: str = "train", rows: int = 0,
                        directory: str = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Return the first ``rows`` (0: all) ``(images, labels)`` of ``split`` ("train": 60000,
    "test": 10000): uint8 images of shape (n, 28, 28) and int64 labels 0..9. Local.

    Raises:
        DataError: unknown ``split``, or the files are missing (install Debian's
            ``dataset-fashion-mnist`` or pass the directory holding the IDX files).
    """
    if split not in _STEMS:
        raise DataError(f"Fashion-MNIST split must be 'train' or 'test', got {split!r}")
    images = read_idx(_find(directory, f"{_STEMS[split]}-images-idx3-ubyte"))
    labels = read_idx(_find(directory, f"{_STEMS[split]}-labels-idx1-ubyte")).astype(np.int64)
    n = len(images) if rows <= 0 else min(rows, len(images))
    return images[:n], labels[:n]


def load_fashion_mnist(directory: str = FASHION_MNIST_DIR) -> dict[str, np.ndarray]:
    """Return Fashion-MNIST as ``x_train`` (60000, 28, 28) uint8, ``y_train``, ``x_test``,
    ``y_test`` (int64). Local.

    Raises:
        DataError: the files are missing (install Debian's ``dataset-fashion-mnist``).
    """
    x_train, y_train = fashion_mnist_split("train", directory=directory)
    x_test, y_test = fashion_mnist_split("test", directory=directory)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def _find(directory: str, stem: str) -> str:
    for path in (os.path.join(directory, stem + ".gz"), os.path.join(directory, stem)):
        if os.path.exists(path):
            return path
    raise DataError(f"Fashion-MNIST file {stem}(.gz) not found in {directory}; install it "
                    "with apt-get install dataset-fashion-mnist or pass its directory")
