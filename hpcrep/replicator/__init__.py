"""TF-Replicator's programming model over MPI ranks.

Write ``input_fn(ctx)`` and ``step_fn(...)`` for one replica; :class:`Replicator` runs them on
every replica (one per rank, or one per ``ranks_per_replica`` ranks), synchronously or in
asynchronous sync groups. See :mod:`hpcrep.replicator.replicator` for the model,
:mod:`hpcrep.replicator.regimes` for how the asynchronous regime exchanges parameters, and
:mod:`hpcrep.replicator.tensor_parallel` for the layers that split their weights over a
replica's ranks. :func:`split_mesh` gives the explicit API the same replicas x shards
communicators (:mod:`hpcrep.comm.mesh`).
"""

from hpcrep.comm.mesh import Mesh
from hpcrep.comm.mesh import split as split_mesh
from hpcrep.replicator.batch_norm import CrossReplicaBatchNormalization
from hpcrep.replicator.context import (InputContext, ReplicaContext, get_replica_context,
                                       in_replica_context)
from hpcrep.replicator.regimes import Synchronous, SyncGroups
from hpcrep.replicator.replicator import PerReplica, Replicator
from hpcrep.replicator.sharded_init import RowBlockInitializer
from hpcrep.replicator.tensor_parallel import (ColumnParallelDense, RowParallelDense,
                                               ShardedEmbedding)
from hpcrep.tensorflow.sharded_variables import broadcast_from_first_replica

__all__ = ["Replicator", "PerReplica", "InputContext", "ReplicaContext", "get_replica_context",
           "in_replica_context", "CrossReplicaBatchNormalization", "Synchronous", "SyncGroups",
           "ColumnParallelDense", "RowParallelDense", "ShardedEmbedding", "RowBlockInitializer",
           "Mesh", "split_mesh", "broadcast_from_first_replica"]
