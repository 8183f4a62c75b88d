"""Transparent mode's ``fit``/``evaluate`` on input that is already each rank's shard (tf.data's
``auto_shard_policy`` OFF): used whole when every rank holds as many batches, and a
``TransparentModeError`` on every rank, naming the ranks, instead of a hang when they differ;
``predict`` gives each rank the predictions of its own shard."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import TransparentModeError
from hpcrep.tensorflow import transparent
from hpcrep.tensorflow.presharded import mark_presharded

BATCH = 2


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def shard(batches: int, rank: int) -> tf.data.Dataset:
    """``batches`` batches of this rank's own rows (row values say which rank made them)."""
    x = np.full((batches * BATCH, 2), rank + 1.0, np.float32)
    return mark_presharded(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(BATCH))


class Steps(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.train = self.test = 0

    def on_train_batch_end(self, batch, logs=None):
        self.train += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test += 1


def model() -> keras.Model:
    m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    m.compile(keras.optimizers.SGD(0.01), "mse")
    return m


def test_fit_and_evaluate_use_each_ranks_shard_whole(world):
    rank, _ = world
    steps = Steps()
    with transparent(announce=False):
        m = model()
        m.fit(shard(5, rank), validation_data=shard(3, rank), epochs=2, callbacks=[steps],
              verbose=0)
        m.evaluate(shard(4, rank).map(lambda x, y: (x, y)), callbacks=[steps], verbose=0)
    assert steps.train == 2 * 5  # not 5 // size: the shard is not cut again
    assert steps.test == 2 * 3 + 4


def test_predict_returns_this_ranks_predictions_of_its_own_shard(world):
    rank, _ = world
    with transparent(announce=False):
        m = model()
        predicted = m.predict(shard(3, rank), verbose=0)
    x = np.full((3 * BATCH, 2), rank + 1.0, np.float32)
    np.testing.assert_allclose(predicted, m(x).numpy(), rtol=1e-6)  # its own rows, all of them


@pytest.mark.parametrize("length", ["known", "unknown"])
def test_unequal_shards_raise_on_every_rank_instead_of_hanging(world, length):
    rank, size = world
    if size == 1:
        pytest.skip("needs 2 ranks: one rank cannot disagree with itself")
    ds = shard(3 + rank % 2, rank)  # 3 batches on even ranks, 4 on odd ones
    if length == "unknown":
        ds = ds.filter(lambda x, y: True)
    odd = list(range(1, size, 2))
    with transparent(announce=False):
        m = model()
        with pytest.raises(TransparentModeError, match=rf"3 on rank\(s\) \[0.*; 4 on rank\(s\) "
                                                       rf"\[{', '.join(map(str, odd))}\]"):
            m.fit(ds, epochs=1, verbose=0)
        with pytest.raises(TransparentModeError, match="different numbers of elements"):
            m.evaluate(ds, verbose=0)
        m.fit(ds.take(3), epochs=1, verbose=0)  # the fix the message suggests
