"""TF-Replicator's programming model over MPI ranks.

Write ``input_fn(ctx)`` and ``step_fn(...)`` for one replica; :class:`Replicator` runs them on
every replica (one per rank), synchronously or in asynchronous sync groups. See
:mod:`hpcrep.replicator.replicator` for the model and :mod:`hpcrep.replicator.regimes` for how
the asynchronous regime exchanges parameters.
"""

from hpcrep.replicator.batch_norm import CrossReplicaBatchNormalization
from hpcrep.replicator.context import (InputContext, ReplicaContext, get_replica_context,
                                       in_replica_context)
from hpcrep.replicator.regimes import Synchronous, SyncGroups
from hpcrep.replicator.replicator import PerReplica, Replicator

__all__ = ["Replicator", "PerReplica", "InputContext", "ReplicaContext", "get_replica_context",
           "in_replica_context", "CrossReplicaBatchNormalization", "Synchronous", "SyncGroups"]
