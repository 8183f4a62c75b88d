"""``tf.data`` face of :class:`hpcrep.data.HDF5ShardReader`: this rank's shard as a Dataset.

A dataset that is one of several ranks' shards is marked as such
(:mod:`hpcrep.tensorflow.presharded`), so transparent mode does not shard it a second time.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from hpcrep.data.reader import HDF5ShardReader
from hpcrep.tensorflow.presharded import mark_presharded


def hdf5_dataset(path: str, keys: Sequence[str], batch_size: int, epochs: int = 1,
                 start_epoch: int = 0, start_step: int = 0, shuffle: bool = True, seed: int = 0,
                 rank: Optional[int] = None, size: Optional[int] = None,
                 prefetch: int = 2) -> tf.data.Dataset:
    """Return a ``tf.data.Dataset`` of this rank's batches for epochs
    ``start_epoch .. start_epoch + epochs - 1``, starting at ``start_step`` in the first one.

    Elements are tuples of tensors, one per key, of ``batch_size`` rows (a single tensor when
    one key is given). Every rank yields ``epochs * steps_per_epoch - start_step`` batches.
    Rank and size default to hpcrep's world. With ``size > 1`` the dataset is marked as this
    rank's shard (tf.data's ``auto_shard_policy = OFF``): transparent mode's ``fit`` and Python
    loops then use it whole instead of sharding it again. (With ``size == 1`` it is the whole
    file and stays unmarked, so that transparent mode shares it out.) Local: no communication.
    """
    reader = HDF5ShardReader(path, keys, batch_size, rank, size, shuffle, seed)
    signature = tuple(tf.TensorSpec((batch_size,) + tuple(shape), tf.as_dtype(dtype))
                      for shape, dtype in reader.specs.values())

    def generate():
        for e in range(start_epoch, start_epoch + epochs):
            yield from reader.batches(e, start_step if e == start_epoch else 0)

    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    if len(signature) == 1:
        ds = ds.map(lambda x: x)
    total = epochs * reader.steps_per_epoch - start_step
    ds = ds.apply(tf.data.experimental.assert_cardinality(total))
    if reader.size > 1:
        ds = mark_presharded(ds)
    return ds.prefetch(prefetch) if prefetch else ds
