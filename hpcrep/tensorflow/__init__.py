"""Horovod-compatible TensorFlow API: ``import hpcrep.tensorflow as hvd``.

The names and semantics are those of ``horovod.tensorflow``; a Horovod user changes one import.
TensorFlow lives here and in the layers above it (``hpcrep.replicator``); ``hpcrep.comm`` and
the other lower packages never import it (``tests/unit/test_layering.py`` checks).
"""

from hpcrep.comm import (Adasum, Average, Max, Min, Product, ProcessSet, ReduceOp, Sum,
                         add_process_set, cross_rank, cross_size, global_process_set,
                         is_homogeneous, is_initialized, local_rank, local_size,
                         mpi_threads_supported, rank, remove_process_set, size)
from hpcrep.comm import barrier as _barrier
from hpcrep.tensorflow.basics import (ccl_built, cuda_built, ddl_built, gloo_built,
                                      gloo_enabled, gpu_available, init, mpi_built, mpi_enabled,
                                      nccl_built, rocm_built, shutdown)
from hpcrep.tensorflow.collectives import (allgather, allreduce, alltoall, broadcast,
                                           grouped_allgather, grouped_allreduce,
                                           grouped_broadcast, grouped_reducescatter,
                                           reducescatter)
from hpcrep.tensorflow.compression import Compression
from hpcrep.tensorflow import elastic
from hpcrep.tensorflow.join import join
from hpcrep.tensorflow.optimizer import DistributedOptimizer
from hpcrep.tensorflow.replica_check import check_replicas
from hpcrep.tensorflow.sync_batch_norm import SyncBatchNormalization
from hpcrep.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape
from hpcrep.tensorflow.timeline import start_timeline, stop_timeline
from hpcrep.tensorflow.topology_ops import (local_rank_op, local_size_op, process_set_included_op,
                                            rank_op, size_op)
from hpcrep.tensorflow.transparent import transparent
from hpcrep.tensorflow import util
from hpcrep.tensorflow.util import _executing_eagerly  # noqa: F401 - Horovod's private name
from hpcrep.tensorflow.variables import (allgather_object, broadcast_, broadcast_global_variables,
                                         broadcast_object, broadcast_object_fn,
                                         broadcast_variables)


def barrier(process_set: object = None) -> None:
    """Wait until every rank of ``process_set`` (default: the job) arrives.

    Collective: every rank of the process set must call this.
    """
    _barrier(process_set)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
    "ccl_built", "ddl_built", "gpu_available", "rank_op", "local_rank_op", "size_op",
    "local_size_op",
    "process_set_included_op", "broadcast_", "PartialDistributedGradientTape", "join",
    "elastic",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
    "grouped_broadcast", "alltoall", "reducescatter", "grouped_reducescatter",
    "broadcast_object", "broadcast_object_fn", "allgather_object", "broadcast_variables",
    "broadcast_global_variables", "util",
    "barrier", "Average", "Sum", "Adasum", "Min", "Max", "Product", "ReduceOp", "Compression",
    "DistributedOptimizer", "DistributedGradientTape", "SyncBatchNormalization",
    "global_process_set", "ProcessSet", "add_process_set", "remove_process_set", "transparent",
    "check_replicas", "start_timeline", "stop_timeline",
]
