"""Horovod's Keras MNIST example (lazily built Sequential, BroadcastGlobalVariablesCallback,
MetricAverageCallback, LearningRateWarmupCallback) trains under hpcrep with only the import
changed (tests/mpi/examples/tensorflow2_keras_mnist.py)."""

import importlib.util
import os

import numpy as np
import pytest

import hpcrep.tensorflow as hvd

pytestmark = pytest.mark.timeout(300)

EXAMPLE = os.path.join(os.path.dirname(__file__), "examples", "tensorflow2_keras_mnist.py")
FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def _fashion_mnist(rows):
    import gzip

    with gzip.open(FASHION) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:rows]
    with gzip.open(FASHION.replace("images-idx3", "labels-idx1")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:rows]
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def test_horovod_keras_mnist_example_trains(world, skip_missing):
    if not os.path.exists(FASHION):
        skip_missing("dataset-fashion-mnist (apt-get install dataset-fashion-mnist)")
    r, n = world
    spec = importlib.util.spec_from_file_location("tensorflow2_keras_mnist", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    images, labels = _fashion_mnist(2048)
    model, history = example.train(images, labels)

    losses = history.history["loss"]
    assert losses[-1] < 0.85 * losses[0], losses  # it learns
    everyone = hvd.allgather_object(([w.tolist() for w in model.get_weights()],
                                     losses, history.history["lr"]))
    for weights, other_losses, lrs in everyone[1:]:
        assert weights == everyone[0][0]  # broadcast after the lazy build, then in step
        assert other_losses == losses  # MetricAverageCallback
        assert lrs == history.history["lr"]  # the warm-up ran alike everywhere
    np.testing.assert_allclose(history.history["lr"][-1], 0.001 * n, rtol=1e-6)  # warmed up
    if n > 1:
        assert history.history["lr"][0] < 0.001 * n
