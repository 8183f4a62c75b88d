"""Initialisation and topology for the TensorFlow face: Horovod's ``hvd.init()`` and friends."""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from hpcrep import comm, config


def threads_per_rank() -> int:
    """Return the intra-op threads each rank should use: ``HPCREP_THREADS`` or cores // local ranks.

    Requires :func:`hpcrep.comm.init`.
    """
    wanted = config.get("HPCREP_THREADS")
    if wanted > 0:
        return wanted
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // comm.local_size())


def configure_threads() -> bool:
    """Size TensorFlow's thread pools for this rank so that ranks x threads ~ cores.

    Returns False (and changes nothing) if TensorFlow's runtime already started, after which the
    pools cannot be resized. Local: each rank decides for itself.
    """
    n = threads_per_rank()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, n))
    except RuntimeError:
        return False
    return True


def init(comm_: Any = None) -> None:
    """Initialise MPI (see :func:`hpcrep.comm.init`) and size TensorFlow's thread pools.

    Collective: every rank must call this, before any other hpcrep call.
    """
    comm.init(comm_)
    configure_threads()


def shutdown() -> None:
    """Release hpcrep's communicators. Collective: every rank must call this."""
    comm.shutdown()


def mpi_enabled() -> bool:
    """Horovod compatibility: hpcrep always runs over MPI."""
    return True


def mpi_built() -> bool:
    """Horovod compatibility: hpcrep always runs over MPI."""
    return True


def gloo_enabled() -> bool:
    """Horovod compatibility: hpcrep has no Gloo controller."""
    return False


def gloo_built() -> bool:
    """Horovod compatibility: hpcrep has no Gloo controller."""
    return False


def nccl_built() -> int:
    """Horovod compatibility: hpcrep does not use NCCL (0 = not built)."""
    return 0


def cuda_built() -> bool:
    """Horovod compatibility: hpcrep's collectives run on the host."""
    return False


def rocm_built() -> bool:
    """Horovod compatibility: hpcrep's collectives run on the host."""
    return False


def ccl_built() -> bool:
    """Horovod compatibility: hpcrep does not use oneCCL."""
    return False


def ddl_built() -> bool:
    """Horovod compatibility: hpcrep does not use IBM DDL."""
    return False
