"""Rank and size as TensorFlow ops: Horovod's ``rank_op``, ``size_op`` and friends.

Each op reads its value when the graph runs, not when it is traced, so a function traced in one
setting returns the right value where it runs. They run on the host (like hpcrep's collectives,
not under XLA), take no inputs, return an int32 scalar, and have no gradient.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.tensorflow.bridge import host_call


def _scalar_op(read: Callable[[], int], name: str) -> tf.Tensor:
    value = host_call(lambda: [np.array(read(), dtype=np.int32)], [], [tf.int32],
                      [tf.TensorShape([])], name=name)[0]
    return tf.stop_gradient(value)


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """Return this process's rank as an int32 scalar tensor. Local."""
    return _scalar_op(comm.rank, name or "hpcrep_rank")


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """Return this process's rank on its node as an int32 scalar tensor. Local.

    (Horovod 0.28's ``local_rank_op`` returns the global rank; hpcrep returns the local one, as
    its docstring and tests state.)
    """
    return _scalar_op(comm.local_rank, name or "hpcrep_local_rank")


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """Return the number of ranks in process set ``process_set_id`` (0: the job) as an int32
    scalar tensor, read when the graph runs. Local.
    """
    return _scalar_op(lambda: len(_members(process_set_id)), name or "hpcrep_size")


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """Return the number of ranks on this node as an int32 scalar tensor. Local."""
    return _scalar_op(comm.local_size, name or "hpcrep_local_size")


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """Return 1 if this rank belongs to process set ``process_set_id`` (0: the job), else 0, as
    an int32 scalar tensor read when the graph runs. Local.

    Raises (when the graph runs):
        ValueError: no process set has that id (add it with ``hvd.add_process_set`` first).
    """
    return _scalar_op(lambda: int(comm.rank() in _members(process_set_id)),
                      name or "hpcrep_process_set_included")


def _members(process_set_id: int) -> list[int]:
    """Job ranks of the registered process set ``process_set_id`` (0 is the whole job)."""
    if int(process_set_id) == 0:
        return list(range(comm.size()))
    sets = comm.process_sets.registered()
    if int(process_set_id) not in sets:
        raise ValueError(f"no process set has id {process_set_id}; registered: {sorted(sets)} "
                         "(hvd.add_process_set adds one).")
    return sets[int(process_set_id)]
