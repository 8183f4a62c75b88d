"""Transparent ``fit`` with ``HPCREP_TRANSPARENT_ELASTIC`` and ``HPCREP_ELASTIC_DIR`` (what
``hpcrep run --elastic`` sets): it commits each epoch to the directory, and a ``fit`` that finds
a commit there (a relaunched script) resumes from it, also a model that only its first step
would build. Runs under ``mpirun -n 4`` and ``-n 1`` (make test-mpi)."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow.elastic import state as elastic_state
from hpcrep.tensorflow.transparent import transparent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def unbuilt_model(seed: int) -> keras.Model:
    """A model without an Input, built by Keras in its first step, its initial weights drawn
    from ``seed`` (each rank alike; transparent mode broadcasts rank 0's anyway)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def train(x, y, epochs: int, as_dataset: bool, seed: int = 7):
    """A script's ``fit``, as run again by a relaunch: its state is the first one created."""
    elastic_state._state_ids = itertools.count(1000)
    model = unbuilt_model(seed)
    with transparent(announce=False):
        if as_dataset:
            history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4),
                                epochs=epochs, verbose=0)
        else:
            history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0)
    return model, history


@pytest.mark.parametrize("as_dataset,scale_lr", [(False, False), (True, False), (False, True)],
                         ids=["arrays", "dataset", "arrays-scaled-lr"])
def test_a_relaunched_fit_resumes_from_the_commit_of_its_last_epoch(world, monkeypatch,
                                                                   tmp_path, as_dataset,
                                                                   scale_lr):
    """With ``HPCREP_TRANSPARENT_SCALE_LR`` the commit holds the rate the script set, and the
    relaunch scales it once for its own size (as an uninterrupted run did)."""
    r, n = world
    rows = np.random.default_rng(0).normal(size=(32 * n, 5)).astype("float32")
    target = rows.sum(axis=1, keepdims=True)
    monkeypatch.setenv("HPCREP_TRANSPARENT_ELASTIC", "1")
    monkeypatch.setenv("HPCREP_TRANSPARENT_SCALE_LR", "1" if scale_lr else "0")
    reference, whole = train(rows, target, 4, as_dataset)  # without a directory: no commits

    directory = hvd.broadcast_object(str(tmp_path), 0)  # rank 0 writes, every rank resumes
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", directory)
    _, first = train(rows, target, 2, as_dataset)  # the job that stopped after 2 epochs
    assert first.epoch == [0, 1]
    # the relaunch (other initial weights, which the commit replaces): epochs 3 and 4 only
    model, resumed = train(rows, target, 4, as_dataset, seed=99)
    assert resumed.epoch == [0, 1, 2, 3]  # one History: the committed epochs and its own
    np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"], rtol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == \
        int(reference.optimizer.iterations.numpy())  # Adam's state came back with the weights
    np.testing.assert_allclose(float(model.optimizer.learning_rate.numpy()),
                               0.01 * (n if scale_lr else 1), rtol=1e-6)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather_object([w.tolist() for w in model.get_weights()])
    assert all(g == gathered[0] for g in gathered)
