"""Cross-replica batch normalisation for step functions run by a Replicator."""

from __future__ import annotations

from typing import Any

from hpcrep.replicator.context import get_replica_context
from hpcrep.tensorflow.sync_batch_norm import SyncBatchNormalization, global_moments


class CrossReplicaBatchNormalization(SyncBatchNormalization):
    """Batch normalisation whose training statistics span the replicas that step together.

    In training, mean and variance come from :func:`hpcrep.tensorflow.sync_batch_norm.
    global_moments`: count, sum and sum of squares of every replica's batch travel in one fused
    allreduce, so the result equals plain batch norm over the concatenated global batch and the
    moving statistics stay equal on every replica. Inference (``training=False``) uses the moving
    statistics and communicates nothing.

    Raises:
        ReplicaContextError: called with ``training=True`` outside a Replicator's ``step_fn``
            (where statistics would silently be local, the Keras pitfall this layer prevents).
    """

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        ctx = get_replica_context()
        if ctx.num_replicas == 1:
            return super(SyncBatchNormalization, self)._moments(inputs, mask)
        return global_moments(inputs, self._reduction_axes, mask)
