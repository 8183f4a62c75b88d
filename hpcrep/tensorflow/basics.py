"""Initialisation and topology for the TensorFlow face: Horovod's ``hvd.init()`` and friends."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import tensorflow as tf

from hpcrep import comm, config
from hpcrep.tensorflow import loss_scale, native, timeline
from hpcrep.tensorflow.devices import pin_gpu


def usable_cores() -> int:
    """Return the cores this process may run on (its CPU affinity where known). Local."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def threads_per_rank() -> int:
    """Return the intra-op threads each rank should use: ``HPCREP_THREADS`` or cores // local ranks.

    Requires :func:`hpcrep.comm.init`.
    """
    wanted = config.get("HPCREP_THREADS")
    if wanted > 0:
        return wanted
    return max(1, usable_cores() // comm.local_size())


def inter_op_threads(intra: int) -> int:
    """Return the inter-op threads for a rank with ``intra`` intra-op threads:
    ``HPCREP_INTER_OP_THREADS``, or where it is 0, 2 if this node has more cores than its ranks'
    intra-op threads (a core to spare), else 1. Requires :func:`hpcrep.comm.init`. Local."""
    wanted = config.get("HPCREP_INTER_OP_THREADS")
    if wanted > 0:
        return wanted
    return 2 if usable_cores() > comm.local_size() * intra else 1


def configure_threads() -> bool:
    """Size TensorFlow's thread pools for this rank so that ranks x threads ~ cores: the
    intra-op pool (what one op's computation uses) gets :func:`threads_per_rank` threads, the
    inter-op pool (which runs independent ops side by side) :func:`inter_op_threads`.

    Two inter-op threads where a core is spare: an inter-op thread takes its newest task
    first, so with only one the backward pass runs its chain of input gradients to the first
    layer and only then the weight gradients it left queued, last layer's last; every gradient
    bucket is then complete at the end of the backward pass and nothing overlaps with it. A
    second thread takes the oldest queued task, the last layers' weight gradients, and their
    buckets go out while the backward pass goes on. Measured on the test cluster (2 nodes x 1
    rank, 2 Gb/s, ResNet-50 64x64 batch 16, 1 intra-op thread): the first bucket handed over at
    a fifth of the step instead of after the whole backward pass, step 1230 -> 950 ms, the
    unsynchronised step unchanged. Where ranks already take every core, the second thread only
    competes with the communication thread: SN-GAN's small step at 2 ranks on this 2-core
    machine took 80-88 ms with 2 against 59-70 ms with 1 (nosync alike).

    Returns False (and changes nothing) if TensorFlow's runtime already started, after which the
    pools cannot be resized. Local: each rank decides for itself.
    """
    n = threads_per_rank()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads(n))
    except RuntimeError:
        return False
    return True


def init(comm_: Any = None, process_sets: Optional[Sequence[Any]] = None) -> None:
    """Initialise MPI (see :func:`hpcrep.comm.init`), size TensorFlow's thread pools, give this
    rank one GPU, ``local_rank % visible GPUs`` (:mod:`hpcrep.tensorflow.devices`;
    ``HPCREP_PIN_GPU=0`` turns that off), make Keras's ``LossScaleOptimizer`` average gradients
    before its finiteness check where it wraps a distributed optimizer
    (:mod:`hpcrep.tensorflow.loss_scale`), start the compiled allreduce path's communication
    thread when it is active (:mod:`hpcrep.tensorflow.native`), start the timeline when
    ``HPCREP_TIMELINE`` names a file (:mod:`hpcrep.tensorflow.timeline`), and register
    ``process_sets``.

    Args:
        comm_: see :func:`hpcrep.comm.init`.
        process_sets: :class:`hpcrep.comm.ProcessSet` objects to register now (as Horovod's
            ``hvd.init(process_sets=[...])``); ones already registered are left as they are.
            ``"dynamic"`` is accepted and means none: hpcrep can always add sets later.

    Collective: every rank must call this, with the same sets, before any other hpcrep call and
    before TensorFlow creates its first tensor.
    """
    comm.init(comm_)
    loss_scale.install()
    configure_threads()
    pin_gpu()
    if native.active():
        # Start the job's communication thread now, while every rank is here: starting it is
        # collective, and a rank already waiting in join() could not take part later.
        native.engine(comm.communicator())
    timeline.start_from_settings()  # HPCREP_TIMELINE: every rank, after the engine started
    if process_sets is None or process_sets == "dynamic":
        return
    for process_set in process_sets:
        if process_set.process_set_id is None:
            comm.add_process_set(process_set)


def shutdown() -> None:
    """Release hpcrep's communicators and restore Keras's ``LossScaleOptimizer.apply``.

    Collective: every rank must call this.
    """
    loss_scale.uninstall()
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


def gpu_available(ext_base_name: str = "tensorflow", verbose: bool = False) -> bool:
    """Horovod compatibility: whether TensorFlow sees a GPU on this rank (``ext_base_name`` and
    ``verbose`` are accepted and ignored; hpcrep stages GPU tensors through the host). Local."""
    return bool(tf.config.list_physical_devices("GPU"))
