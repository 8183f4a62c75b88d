"""Horovod's ``hvd.join()`` for TensorFlow: training on uneven data (:mod:`hpcrep.comm.join`)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hpcrep.comm.join import join as comm_join
from hpcrep.tensorflow.bridge import host_call


def join(device: str = "") -> tf.Tensor:
    """Wait, taking part in the other ranks' allreduces and allgathers with nothing, until every
    rank has joined; return (int32 scalar) the highest rank among the last ones to join.

    A rank that runs out of data calls this; the others' gradient allreduces complete with its
    contribution absent (Average still divides by the full size, as in Horovod). Only allreduce
    (Sum, Average) and allgather may run while a rank waits; anything else raises on every rank.
    Afterwards the ranks' weights differ (the joined rank skipped updates): broadcast them, e.g.
    from the returned rank. ``device`` is accepted for Horovod compatibility and ignored.

    Collective: every rank must call this, once it has no more batches.
    """
    return host_call(lambda: [np.array(comm_join(), dtype=np.int32)], [], [tf.int32],
                     [tf.TensorShape([])], name="hpcrep_join")[0]
