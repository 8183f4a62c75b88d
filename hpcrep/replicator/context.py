"""Input and replica contexts: what ``input_fn`` and ``step_fn`` know about their replica.

A replica is an abstraction over ranks: each rank runs one replica, or with
``ranks_per_replica = k`` each replica spans k ranks (:mod:`hpcrep.comm.mesh`). Replica ``i`` is
rank ``i`` of the communicator of the replicas that step together (job rank
``communicator.ranks[i]``): the job, a sync group, or the ranks with this rank's shard index; the
mapping lives only in :meth:`ReplicaContext._rank_of`. The primitives run on that communicator,
which ``Replicator.run`` makes current around ``step_fn``.

The active replica context is a per-thread stack that :meth:`Replicator.run` pushes around each
call of ``step_fn`` (eagerly, or while ``tf.function`` traces it). Using a primitive with no
active context, or through a context object kept after its step ended, raises
:class:`~hpcrep.errors.ReplicaContextError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator, Optional

import tensorflow as tf

from hpcrep.comm.communicator import Communicator
from hpcrep.comm.mesh import Mesh
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import ReplicaContextError, ReplicatorError
from hpcrep.tensorflow import collectives
from hpcrep.tensorflow.presharded import mark_presharded

_OPS = {"sum": ReduceOp.Sum, "mean": ReduceOp.Average, "average": ReduceOp.Average,
        "min": ReduceOp.Min, "max": ReduceOp.Max}


def as_op(op: Any) -> ReduceOp:
    """Return the :class:`ReduceOp` for ``"sum"``, ``"mean"``, ``"min"``, ``"max"``, a
    ``ReduceOp`` or a ``tf.distribute.ReduceOp`` (SUM, MEAN).

    Raises:
        ReplicatorError: anything else (Product and Adasum are not replica reductions).
    """
    key = getattr(op, "value", op)
    if isinstance(key, str) and key.lower() in _OPS:
        return _OPS[key.lower()]
    try:
        resolved = as_reduce_op(op)
    except (ValueError, TypeError, KeyError):
        resolved = None
    if resolved not in _OPS.values():
        raise ReplicatorError(
            f"unsupported reduction {op!r}: expected 'sum', 'mean', 'min' or 'max' (or the "
            "matching ReduceOp / tf.distribute.ReduceOp)")
    return resolved


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What ``input_fn(ctx)`` knows: which replica's input it builds, among how many.

    Attributes:
        replica_id: this replica's index among all replicas of the job (every sync group).
        num_replicas: replicas in the job; shard the data ``num_replicas`` ways.
        group_id: this replica's sync group (0 in the synchronous regime).
        num_groups: number of sync groups (1 in the synchronous regime).
        shard_index: with replicas of several ranks, which of its replica's ranks builds this
            input (0 .. num_shards - 1); every rank of a replica must build the same data.
        num_shards: ranks per replica (1 unless ``Replicator(ranks_per_replica=k)``).
    """

    replica_id: int
    num_replicas: int
    group_id: int = 0
    num_groups: int = 1
    shard_index: int = 0
    num_shards: int = 1

    def shard(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Return this replica's share of ``dataset`` (every ``num_replicas``-th element), marked
        as already sharded (tf.data's ``auto_shard_policy`` OFF), as are the datasets derived
        from it, so that transparent mode does not shard it again."""
        return mark_presharded(dataset.shard(self.num_replicas, self.replica_id))


class ReplicaContext:
    """Cross-replica primitives available inside ``step_fn``.

    ``replica_id`` and ``num_replicas`` count the replicas that step together: all replicas in
    the synchronous regime, the replicas of this sync group in the asynchronous one. Every
    primitive is collective over those replicas: each must call it, in the same order.

    With replicas of several ranks (``Replicator(ranks_per_replica=k)``) each rank of a replica
    runs ``step_fn``; ``shard_index`` says which, ``model_parallel`` is the replica's ranks and
    ``data_parallel`` the ranks with the same shard index in every replica. The primitives then
    run on ``data_parallel``: a value that is the same on every rank of a replica (a loss) is
    combined over the replicas, on every rank.
    """

    def __init__(self, replica_id: int, num_replicas: int, group_id: int = 0,
                 num_groups: int = 1, communicator: Optional[Communicator] = None,
                 mesh: Optional[Mesh] = None) -> None:
        self._replica_id = int(replica_id)
        self._num_replicas = int(num_replicas)
        self.group_id = int(group_id)
        self.num_groups = int(num_groups)
        self._communicator = communicator
        self._mesh = mesh

    @property
    def replica_id(self) -> int:
        """Index of this replica among the replicas that step together."""
        self._check_active("replica_id")
        return self._replica_id

    @property
    def num_replicas(self) -> int:
        """Number of replicas that step together (and that the primitives span)."""
        self._check_active("num_replicas")
        return self._num_replicas

    @property
    def shard_index(self) -> int:
        """This rank's place among its replica's ranks (0 with one rank per replica)."""
        self._check_active("shard_index")
        return self._mesh.shard_index if self._mesh is not None else 0

    @property
    def num_shards(self) -> int:
        """Ranks per replica (1 unless the Replicator has ``ranks_per_replica > 1``)."""
        self._check_active("num_shards")
        return self._mesh.num_shards if self._mesh is not None else 1

    @property
    def mesh(self) -> Optional[Mesh]:
        """The :class:`hpcrep.comm.mesh.Mesh` of replicas x shards (None without one)."""
        self._check_active("mesh")
        return self._mesh

    @property
    def model_parallel(self) -> Optional[Communicator]:
        """This replica's ranks, in shard order (pass as ``process_set=``); None without a
        mesh."""
        self._check_active("model_parallel")
        return self._mesh.model_parallel if self._mesh is not None else None

    @property
    def data_parallel(self) -> Optional[Communicator]:
        """The ranks with this shard index, one per replica (where gradients are averaged);
        None without a mesh."""
        self._check_active("data_parallel")
        return self._mesh.data_parallel if self._mesh is not None else None

    def all_reduce(self, op: Any, value: Any) -> Any:
        """Reduce ``value`` (a tensor or a nest of tensors) over the replicas: every replica gets
        the result. ``op`` is ``"sum"``, ``"mean"``, ``"min"`` or ``"max"``. A nest travels in
        one fused exchange. Differentiable.

        Collective: every replica must call this, in the same order, with matching values.
        """
        self._check_active("all_reduce")
        reduce_op = as_op(op)
        flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(value)]
        reduced = collectives.grouped_allreduce(flat, op=reduce_op, name="replica.all_reduce")
        return tf.nest.pack_sequence_as(value, reduced)

    def all_gather(self, value: Any, axis: int = 0) -> tf.Tensor:
        """Concatenate every replica's ``value`` along ``axis``, in replica order.

        Sizes along ``axis`` may differ between replicas; the other dimensions must agree.
        Differentiable.

        Collective: every replica must call this, in the same order.
        """
        self._check_active("all_gather")
        value = tf.convert_to_tensor(value)
        if value.shape.rank == 0:
            raise ReplicatorError(
                "all_gather needs a tensor with at least one dimension, got a scalar; gather "
                "tf.reshape(value, [1]) instead")
        rank = value.shape.rank
        axis = axis + rank if axis < 0 else axis
        if axis == 0:  # gradients summed across replicas, as tf.distribute's all_gather does
            return collectives.gather_rows(value, "replica.all_gather", ReduceOp.Sum,
                                           self._communicator)
        perm = [axis] + [d for d in range(rank) if d != axis]
        inverse = [perm.index(d) for d in range(rank)]
        gathered = collectives.gather_rows(tf.transpose(value, perm), "replica.all_gather",
                                           ReduceOp.Sum, self._communicator)
        return tf.transpose(gathered, inverse)

    def broadcast(self, value: Any, source_replica: int = 0) -> Any:
        """Return replica ``source_replica``'s ``value`` (tensor or nest) on every replica.

        Collective: every replica must call this, in the same order, with matching values.
        """
        self._check_active("broadcast")
        if not 0 <= int(source_replica) < self._num_replicas:
            raise ReplicatorError(
                f"broadcast from replica {source_replica}, but replicas are numbered "
                f"0..{self._num_replicas - 1}")
        root = self._rank_of(int(source_replica))
        flat = [collectives.broadcast_from(v, root, "replica.broadcast", ReduceOp.Sum,
                                           self._communicator)
                for v in tf.nest.flatten(value)]
        return tf.nest.pack_sequence_as(value, flat)

    def _rank_of(self, replica_id: int) -> int:
        """Job rank that runs ``replica_id`` (one replica per rank): collectives take job ranks."""
        return replica_id if self._communicator is None else self._communicator.ranks[replica_id]

    def _check_active(self, what: str) -> None:
        stack = _stack()
        if not stack or stack[-1] is not self:
            raise ReplicaContextError(
                f"ReplicaContext.{what} was used outside a step function: replica primitives are "
                "available only while Replicator.run(step_fn, ...) runs step_fn (eagerly or "
                "while tf.function traces it). Move the call into step_fn, or reduce results "
                "outside with Replicator.reduce(op, value).")


_local = threading.local()


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


@contextlib.contextmanager
def active(ctx: ReplicaContext) -> Iterator[ReplicaContext]:
    """Make ``ctx`` the active replica context for the duration of the block. Local."""
    _stack().append(ctx)
    try:
        yield ctx
    finally:
        _stack().pop()


def get_replica_context() -> ReplicaContext:
    """Return the replica context of the running ``step_fn``.

    Raises:
        ReplicaContextError: called outside a step function run by :meth:`Replicator.run`.
    """
    stack = _stack()
    if not stack:
        raise ReplicaContextError(
            "get_replica_context() was called outside a step function: there is a replica "
            "context only while Replicator.run(step_fn, ...) runs step_fn. Call it inside "
            "step_fn, or use Replicator.reduce(op, value) outside.")
    return stack[-1]


def in_replica_context() -> bool:
    """Return True while a ``step_fn`` run by :meth:`Replicator.run` is running."""
    return bool(_stack())


def current_or_none() -> Optional[ReplicaContext]:
    """Return the active replica context, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def _mesh_stack() -> list:
    if not hasattr(_local, "meshes"):
        _local.meshes = []
    return _local.meshes


@contextlib.contextmanager
def building_with(mesh: Optional[Mesh]) -> Iterator[None]:
    """Make ``mesh`` the one tensor-parallel layers created in this block shard over. Local.

    ``Replicator.scope()`` wraps its block in it."""
    _mesh_stack().append(mesh)
    try:
        yield
    finally:
        _mesh_stack().pop()


def current_mesh() -> Optional[Mesh]:
    """The mesh a tensor-parallel layer created now shards over: the innermost
    :func:`building_with` block's, else the running ``step_fn``'s replica's, else None (one
    shard). Local."""
    meshes = _mesh_stack()
    if meshes:
        return meshes[-1]
    ctx = current_or_none()
    return ctx._mesh if ctx is not None else None
