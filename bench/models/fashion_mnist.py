"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (offline, MIT licence)."""

from __future__ import annotations

import gzip
import os

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def load(split: str = "train", directory: str = DEFAULT_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: uint8 images of shape (n, 28, 28) and int64 labels.

    Raises:
        FileNotFoundError: the files are absent; says which package installs them.
    """
    prefix = {"train": "train", "test": "t10k"}[split]
    paths = [os.path.join(directory, f"{prefix}-{kind}-idx{dim}-ubyte.gz")
             for kind, dim in (("images", 3), ("labels", 1))]
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"Fashion-MNIST file {path} is missing: apt-get install dataset-fashion-mnist "
                f"(or pass the directory holding the idx .gz files)")
    with gzip.open(paths[0]) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(paths[1]) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return images, labels


def shard(images: np.ndarray, labels: np.ndarray, rank: int, size: int,
          limit: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return this rank's contiguous slice of the first ``limit`` examples (all if 0)."""
    n = len(images) if limit <= 0 else min(limit, len(images))
    per = n // size
    return images[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]
