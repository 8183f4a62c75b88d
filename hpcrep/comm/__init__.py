"""hpcrep's MPI layer: collectives on numpy arrays (mpi4py + numpy; never TensorFlow).

Every collective runs on a private communicator made by :func:`init` (the job's, by default; a
process set's or a sync group's when given ``communicator=``, or inside :func:`using`), checks
that all ranks agree on what they pass (a mismatch raises on every rank), and fuses grouped arrays
into few aligned buffers. :func:`rank` and :func:`size` always describe the job. See
:mod:`hpcrep.comm.collectives` for the semantics of each call, and :func:`join` for uneven data.
:func:`init` also checks that every rank holds the same values of the settings that decide which
MPI calls are made (:mod:`hpcrep.config`, ``same_on_all_ranks``).
"""

from hpcrep.comm.collectives import (allgather, allgather_object, allgatherv, allreduce,
                                     alltoall,
                                     barrier, broadcast, broadcast_object, grouped_allgather,
                                     grouped_allgatherv, grouped_allreduce, grouped_broadcast,
                                     grouped_reducescatter, reducescatter)
from hpcrep.comm import grow  # noqa: F401 - its init hook must be in place before init()
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.current import current, resolve, using
from hpcrep.comm.join import join
from hpcrep.comm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from hpcrep.comm.process_sets import (ProcessSet, add_process_set, global_process_set,
                                      remove_process_set)
from hpcrep.comm.world import (abort, comm, communicator, cross_rank, cross_size, init,
                               is_homogeneous, is_initialized, local_rank, local_size,
                               mpi_library_version, mpi_threads_supported, rank, shutdown, size)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported",
    "mpi_library_version", "comm", "abort",
    "Communicator", "communicator", "current", "resolve", "using",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "allgatherv",
    "grouped_allgatherv", "broadcast",
    "grouped_broadcast", "alltoall", "reducescatter", "grouped_reducescatter",
    "broadcast_object", "allgather_object",
    "barrier", "join", "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
]
