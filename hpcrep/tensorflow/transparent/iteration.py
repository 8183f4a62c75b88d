"""Custom training loops: a ``tf.data`` dataset iterated in Python yields this rank's share.

``for batch in dataset:`` (eager, outside ``fit``/``evaluate``/``predict``, which shard their own
inputs) iterates every ``size``-th element from ``rank``, the same count on every rank, as
:func:`~.sharding.shard_dataset` cuts it. Datasets shorter than the number of ranks (a
``take(1)`` peek) and datasets of unknown length are iterated whole: sharding them would empty a
peek or cost a counting pass. Iteration inside ``tf.function`` is not changed.

A dataset marked as this rank's shard already (tf.data's
``options().experimental_distribute.auto_shard_policy == AutoShardPolicy.OFF``, see
:mod:`hpcrep.tensorflow.presharded`), such as ``hpcrep.tensorflow.hdf5_dataset``'s or one derived
from it by ``map``/``batch``/``prefetch``..., is iterated whole. Set that option on input you
shard yourself to opt out. Iterating stays local (no communication, so a loop or a peek on some
ranks only cannot hang): equal lengths across ranks are the marker's promise here, which
``hdf5_dataset`` keeps, while ``fit`` and ``evaluate`` check it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hpcrep import comm
from hpcrep.tensorflow.presharded import is_presharded
from hpcrep.tensorflow.transparent import sharding
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class
from hpcrep.tensorflow.transparent.state import in_keras_loop


def should_shard(dataset: tf.data.Dataset, size: int) -> bool:
    """Return True if a Python loop over ``dataset`` should see only this rank's share."""
    if size == 1 or in_keras_loop() or not tf.executing_eagerly() or is_presharded(dataset):
        return False
    cardinality = int(dataset.cardinality())
    return cardinality == tf.data.INFINITE_CARDINALITY or cardinality >= size


def install(patches: PatchSet) -> None:
    """Patch ``tf.data.Dataset.__iter__``. Local."""
    owner = defining_class(tf.data.Dataset, "__iter__")
    original = vars(owner)["__iter__"]

    def __iter__(self: Any) -> Any:
        rank, size = comm.rank(), comm.size()  # now: an elastic job may have shrunk
        if should_shard(self, size):
            return original(sharding.shard_dataset(self, rank, size, equal=True))
        return original(self)

    patches.attr(owner, "__iter__", __iter__)
    patches.label("tf.data iteration in Python loops (sharded, equal steps)")
