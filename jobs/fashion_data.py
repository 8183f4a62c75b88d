"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (offline), for the plain-Keras
example scripts in ``jobs/``. Plain numpy: the scripts that import it know nothing of hpcrep."""

from __future__ import annotations

import gzip
import os

import numpy as np

DIRECTORY = "/usr/share/datasets/fashion-mnist"


def load(split: str = "train", rows: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return the first ``rows`` (0: all) images, float32 in [0, 1], shape (n, 784), and labels."""
    prefix = {"train": "train", "test": "t10k"}[split]
    images_path = os.path.join(DIRECTORY, f"{prefix}-images-idx3-ubyte.gz")
    labels_path = os.path.join(DIRECTORY, f"{prefix}-labels-idx1-ubyte.gz")
    if not os.path.exists(images_path):
        raise FileNotFoundError(f"{images_path} is missing: apt-get install dataset-fashion-mnist")
    with gzip.open(images_path) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(labels_path) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    n = len(images) if rows <= 0 else min(rows, len(images))
    return (images[:n].astype(np.float32) / 255.0), labels[:n]
