"""The mark of a ``tf.data`` dataset that already holds only this rank's data.

hpcrep uses tf.data's own marker, the one ``tf.distribute`` reads too: a dataset whose
``options().experimental_distribute.auto_shard_policy`` is
``tf.data.experimental.AutoShardPolicy.OFF`` is not sharded again. Transparent mode
(:mod:`hpcrep.tensorflow.transparent`) leaves such a dataset whole in ``fit``, ``evaluate``,
``predict`` and Python loops. hpcrep's own per-rank inputs carry it:
:func:`hpcrep.tensorflow.hdf5_dataset.hdf5_dataset` and the datasets of a Replicator's
``input_fn``. A user who shards their own input opts out the same way::

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = my_shard_of_the_data.with_options(options)

Options travel with a dataset through its transformations (``map``, ``batch``, ``prefetch``,
``shuffle``, ``repeat``, ``take``, ``filter``, ``unbatch``, ``cache``, ``interleave``, ... and
``zip``/``concatenate``, from either input; checked on TF 2.21 by
``tests/unit/test_transparent_units.py``), so a dataset derived from a marked one is marked.
Local: nothing here communicates.
"""

from __future__ import annotations

import tensorflow as tf

OFF = tf.data.experimental.AutoShardPolicy.OFF


def is_presharded(dataset: tf.data.Dataset) -> bool:
    """Return True if ``dataset`` is marked as this rank's shard already (auto-shard policy OFF)."""
    return dataset.options().experimental_distribute.auto_shard_policy == OFF


def mark_presharded(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Return ``dataset`` marked as this rank's shard (itself if it is marked already)."""
    if is_presharded(dataset):
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = OFF
    return dataset.with_options(options)
