"""A Frechet distance for Fashion-MNIST generators: features from a small Keras CNN that the
project trains itself (no Inception weights can be downloaded here).

- :func:`feature_classifier` returns the classifier for one image size, training it on the
  Fashion-MNIST training set on first use and storing its weights as an HDF5 file
  (``fashion_mnist_classifier_<size>px.weights.h5`` in ``cache_dir``, default
  ``$XDG_CACHE_HOME/hpcrep`` or ``~/.cache/hpcrep``), written under a temporary name and renamed
  into place, so an interrupted training never leaves a half-written file; the file records the
  classifier's test accuracy and how it was trained as HDF5 attributes.
- :func:`features` maps images in [-1, 1] (the generator's range) to the classifier's
  penultimate layer (``FEATURES`` units).
- :func:`reference_images` is Fashion-MNIST preprocessed exactly as ``jobs.sngan`` preprocesses
  its training data (bilinear resize of the 28x28 images, then [0, 255] -> [-1, 1]).
- :func:`fid` is the Frechet distance (:mod:`bench.frechet`) between the features of two image
  sets.

Local: nothing here communicates. Runs in the harness's process, not in the MPI jobs.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

import numpy as np

from bench.frechet import frechet_distance_of

FEATURES = 128
TRAIN_EPOCHS = 3
TRAIN_SEED = 0


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/hpcrep`` (``~/.cache/hpcrep`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hpcrep")


def classifier_path(image_size: int, cache_dir: Optional[str] = None, train_rows: int = 0,
                    epochs: int = TRAIN_EPOCHS) -> str:
    """Where the classifier for ``image_size`` is stored (a classifier trained on fewer rows or
    epochs than the default, as the test suite's, has a name of its own)."""
    short = "" if (train_rows, epochs) == (0, TRAIN_EPOCHS) else f"_{train_rows}rows_{epochs}ep"
    return os.path.join(cache_dir or default_cache_dir(),
                        f"fashion_mnist_classifier_{image_size}px{short}.weights.h5")


def reference_images(split: str, image_size: int, rows: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` as (n, size, size, 1) float32 in [-1, 1] and int labels, resized as
    ``jobs.sngan.train.load`` resizes its training images."""
    import tensorflow as tf  # noqa: PLC0415

    from hpcrep.data import fashion_mnist_split  # noqa: PLC0415

    x, y = fashion_mnist_split(split, rows)
    x = tf.image.resize(x[..., None].astype(np.float32), (image_size,) * 2).numpy()
    return x / 127.5 - 1.0, y


def build_classifier(image_size: int) -> Any:
    """The CNN (uncompiled): three 3x3 convolutions, a ``FEATURES``-unit dense layer named
    ``features`` (what the distance uses) and a 10-way softmax."""
    import keras  # noqa: PLC0415

    L = keras.layers
    inputs = keras.Input((image_size, image_size, 1))
    h = L.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = L.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = L.MaxPooling2D()(h)
    h = L.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = L.MaxPooling2D()(h)
    h = L.Flatten()(h)
    h = L.Dense(FEATURES, activation="relu", name="features")(h)
    outputs = L.Dense(10, activation="softmax", name="classes")(h)
    return keras.Model(inputs, outputs, name=f"fashion_mnist_classifier_{image_size}px")


def train_classifier(image_size: int, path: str, epochs: int = TRAIN_EPOCHS,
                     train_rows: int = 0, verbose: int = 0) -> dict:
    """Train the classifier on Fashion-MNIST's training set (first ``train_rows``, 0: all) and
    store it at ``path`` atomically; return its attributes (test accuracy, ...)."""
    import h5py  # noqa: PLC0415
    import keras  # noqa: PLC0415

    keras.utils.set_random_seed(TRAIN_SEED)
    x, y = reference_images("train", image_size, train_rows)
    xt, yt = reference_images("test", image_size)
    model = build_classifier(image_size)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=128, epochs=epochs, verbose=verbose)
    _, accuracy = model.evaluate(xt, yt, batch_size=1000, verbose=0)
    attrs = {"test_accuracy": float(accuracy), "image_size": image_size, "epochs": epochs,
             "train_rows": len(x), "seed": TRAIN_SEED, "features": FEATURES}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".weights.h5", dir=directory)  # Keras wants the suffix
    os.close(fd)
    try:
        model.save_weights(tmp, overwrite=True)
        with h5py.File(tmp, "a") as f:
            f.attrs.update(attrs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return attrs


def feature_classifier(image_size: int, cache_dir: Optional[str] = None, train_rows: int = 0,
                       epochs: int = TRAIN_EPOCHS, verbose: int = 0) -> tuple[Any, dict]:
    """The classifier for ``image_size`` and its stored attributes, trained (on the first
    ``train_rows`` training images, 0: all, for ``epochs``) and stored first if its file is
    missing: about a minute on one core for 16x16 images and the defaults (88% test accuracy)."""
    import h5py  # noqa: PLC0415

    path = classifier_path(image_size, cache_dir, train_rows, epochs)
    if not os.path.exists(path):
        train_classifier(image_size, path, epochs, train_rows, verbose)
    model = build_classifier(image_size)
    model.load_weights(path)
    with h5py.File(path, "r") as f:
        attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    return model, attrs | {"path": path}


def features(model: Any, images: np.ndarray, batch: int = 500) -> np.ndarray:
    """Penultimate-layer features (n, ``FEATURES``) of images (n, size, size, 1) in [-1, 1]."""
    import keras  # noqa: PLC0415

    extractor = keras.Model(model.inputs, model.get_layer("features").output)
    return np.asarray(extractor.predict(np.asarray(images, np.float32), batch_size=batch,
                                        verbose=0), np.float64)


def fid(model: Any, images1: np.ndarray, images2: np.ndarray) -> float:
    """Frechet distance between the classifier features of two image sets."""
    return frechet_distance_of(features(model, images1), features(model, images2))
