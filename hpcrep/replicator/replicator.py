"""The Replicator: write ``input_fn`` and ``step_fn`` for one replica, run them on every replica.

TF-Replicator's programming model (Buchlovsky et al. 2019) over MPI ranks::

    rep = Replicator()                                  # or Replicator(SyncGroups(2))
    with rep.scope():                                   # variables start equal everywhere
        model = make_model()
        opt = rep.wrap_optimizer(keras.optimizers.SGD(0.1))

    def input_fn(ctx):                                  # ctx.replica_id, ctx.num_replicas
        return ctx.shard(dataset).batch(32).repeat()

    def step_fn(batch):                                 # one replica's step
        ctx = get_replica_context()                     # all_reduce, all_gather, broadcast
        ...
        return loss

    loss = rep.reduce("mean", rep.run(step_fn, input_fn))

``run`` returns a :class:`PerReplica` (one value per replica this rank runs; today exactly one);
``reduce`` combines it over the replicas. Both work eagerly and inside ``tf.function``.

Replicas of several ranks (tensor parallelism)::

    rep = Replicator(ranks_per_replica=2)               # 4 ranks: 2 replicas x 2 shards
    with rep.scope():
        model = keras.Sequential([keras.Input((16,)),
                                  ColumnParallelDense(64, activation="relu"),
                                  RowParallelDense(1)])

Each replica is ``ranks_per_replica`` consecutive ranks (:mod:`hpcrep.comm.mesh`) that run
``step_fn`` on the same batch (``input_fn``'s ctx describes the replica), each holding one shard
of the tensor-parallel layers (:mod:`hpcrep.replicator.tensor_parallel`). ``replica_id`` and
``num_replicas`` keep counting replicas; ``ctx.shard_index``/``ctx.num_shards`` say which rank of
its replica runs. ``wrap_optimizer`` averages every gradient over the ranks with the same shard
index (``mesh.data_parallel``): over the replicas for whole variables, over the copies of the
same shard for sharded ones. ``reduce`` and the context's primitives run there too.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, NamedTuple, Optional

import keras
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm import mesh as mesh_mod
from hpcrep.errors import CollectiveArgumentError, ReplicatorError
from hpcrep.replicator import context as ctx_mod
from hpcrep.replicator.context import InputContext, ReplicaContext, as_op
from hpcrep.replicator.regimes import GroupRuntime, SyncGroups, as_regime
from hpcrep.tensorflow import basics, collectives
from hpcrep.tensorflow.optimizer import DistributedOptimizer, is_distributed
from hpcrep.tensorflow.presharded import mark_presharded
from hpcrep.tensorflow.sharded_variables import broadcast_from_first_replica
from hpcrep.tensorflow.timeline import mark_step


class PerReplica(NamedTuple):
    """The values of one result on each replica this rank runs, in local replica order.

    A named tuple, so ``tf.function`` can return it and ``tf.nest`` walks into it.
    """

    values: tuple


class Replicator:
    """Replicates a single-replica ``step_fn`` over every rank: one replica per rank, or per
    ``ranks_per_replica`` consecutive ranks.

    Args:
        regime: ``"sync"`` (default), ``"async"`` (two sync groups), or a
            :class:`~hpcrep.replicator.Synchronous` / :class:`~hpcrep.replicator.SyncGroups`.
        ranks_per_replica: ranks that hold one replica between them (default 1); must divide
            the number of ranks. Above 1, the tensor-parallel layers created in :meth:`scope`
            split their weights over a replica's ranks. Synchronous regime only.

    Raises:
        ReplicatorError: (on every rank) ``ranks_per_replica`` is not a positive integer that
            divides the number of ranks, or is above 1 with sync groups.
        CollectiveMismatchError: ranks passed different ``ranks_per_replica``.

    Creating and closing a Replicator is collective: every rank must do it, in the same order.
    Initialises hpcrep if needed. :meth:`run` and :meth:`reduce` run inside
    ``hpcrep.comm.using(...)`` of the replicas that step together: the job, or in the
    asynchronous regime this rank's sync group (see :mod:`hpcrep.replicator.regimes`), or with
    several ranks per replica the ranks with this rank's shard index (:attr:`mesh`'s
    ``data_parallel``); nothing else changes, so ``hvd.rank()`` and ``hvd.size()`` keep
    describing the job.
    """

    def __init__(self, regime: Any = "sync", ranks_per_replica: int = 1) -> None:
        basics.init()
        self.regime = as_regime(regime)
        try:
            self._mesh = mesh_mod.split(ranks_per_replica)
        except CollectiveArgumentError as error:
            raise ReplicatorError(f"Replicator(ranks_per_replica={ranks_per_replica!r}): "
                                  f"{error}") from None
        if isinstance(self.regime, SyncGroups) and self._mesh.ranks_per_replica > 1:
            self._mesh.free()
            raise ReplicatorError(
                f"Replicator(ranks_per_replica={ranks_per_replica}) runs in the synchronous "
                "regime only; sync groups of multi-rank replicas are not implemented. Use "
                "regime='sync', or ranks_per_replica=1 with SyncGroups.")
        self._group: Optional[GroupRuntime] = None
        if isinstance(self.regime, SyncGroups):
            self._group = GroupRuntime(self.regime)
        self._communicator = self._group.group if self._group else self._mesh.data_parallel
        self._iterators: dict[tuple[int, int], tuple[Iterator, Callable]] = {}
        self._closed = False

    # -- replicas ------------------------------------------------------------------------------

    @property
    def num_replicas(self) -> int:
        """Replicas in the whole job (every sync group)."""
        return self._mesh.num_replicas

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas that step together: all of them, or this rank's sync group."""
        return self._group.layout.group_size if self._group else self._mesh.num_replicas

    @property
    def local_replica_ids(self) -> tuple[int, ...]:
        """Job-wide ids of the replicas this rank runs (today: one; the rank divided by
        ``ranks_per_replica``)."""
        return (self._mesh.replica_id,)

    @property
    def ranks_per_replica(self) -> int:
        """Ranks that hold one replica (the shards of its tensor-parallel layers)."""
        return self._mesh.ranks_per_replica

    @property
    def shard_index(self) -> int:
        """This rank's place among its replica's ranks (0 with one rank per replica)."""
        return self._mesh.shard_index

    @property
    def mesh(self) -> mesh_mod.Mesh:
        """The replicas x shards layout: ``model_parallel`` (this replica's ranks) and
        ``data_parallel`` (the ranks with this shard index) communicators."""
        return self._mesh

    @property
    def communicator(self) -> comm.Communicator:
        """The replicas that step together: the job, this rank's sync group, or with several
        ranks per replica the ranks with this rank's shard index.

        ``run`` and ``reduce`` make it current; elsewhere pass it as ``process_set=`` to an
        ``hvd.*`` collective (or ``communicator=`` to :mod:`hpcrep.comm`) to reach the group.
        """
        return self._communicator

    @property
    def group_id(self) -> int:
        """This rank's sync group (0 in the synchronous regime)."""
        return self._group.layout.group_id if self._group else 0

    @property
    def num_groups(self) -> int:
        """Number of sync groups (1 in the synchronous regime)."""
        return self._group.layout.num_groups if self._group else 1

    def _replica_context(self, local_index: int) -> ReplicaContext:
        if self._group:
            lay = self._group.layout
            return ReplicaContext(lay.group_rank, lay.group_size, lay.group_id, lay.num_groups,
                                  self._communicator)
        return ReplicaContext(self.local_replica_ids[local_index], self._mesh.num_replicas,
                              communicator=self._communicator, mesh=self._mesh)

    def _input_context(self, local_index: int) -> InputContext:
        return InputContext(self.local_replica_ids[local_index], self._mesh.num_replicas,
                            self.group_id, self.num_groups, self._mesh.shard_index,
                            self._mesh.num_shards)

    # -- variables -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self) -> Iterator["Replicator"]:
        """Variables created in this block start with replica 0's values on every replica.

        Records every variable created inside (``tf.variable_creator_scope``) and broadcasts
        them from replica 0 on exit, over the whole job; a sharded variable of a
        tensor-parallel layer (which the layers created here split over this Replicator's
        replicas) only among the ranks holding the same shard. In the asynchronous regime the
        trainable ones become the parameters the groups exchange.

        Collective: every rank must enter and leave the block, in the same order.
        """
        self._check_open()
        created: list[tf.Variable] = []

        def record(next_creator: Callable, **kwargs: Any) -> tf.Variable:
            variable = next_creator(**kwargs)
            created.append(variable)
            return variable

        with tf.variable_creator_scope(record), ctx_mod.building_with(self._mesh):
            yield self
        with comm.using(comm.communicator()):  # over the whole job, every group alike
            broadcast_from_first_replica(created, self._mesh.data_parallel)
        if self._group and any(v.trainable and v.dtype.is_floating for v in created):
            self._group.attach(created)

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer, **kwargs: Any
                       ) -> keras.optimizers.Optimizer:
        """Return ``optimizer`` averaging gradients over the replicas that step together.

        With several ranks per replica it averages over the ranks with this rank's shard index
        (the communicator current in :meth:`run`): whole variables over the replicas, sharded
        ones over the copies of the same shard. ``kwargs`` go to
        :func:`hpcrep.tensorflow.DistributedOptimizer` (compression, op, ...).
        ``shard_optimizer_state=True`` keeps 1/N of the optimizer's slots on each of the N
        replicas (ZeRO stage 1, :mod:`hpcrep.tensorflow.zero`; synchronous regime only). An
        optimizer that already reduces its gradients is returned unchanged.

        Raises:
            ReplicatorError: ``shard_optimizer_state`` in the asynchronous regime (each sync
                group keeps its own copy of the weights; their state is not sharded).
        """
        if kwargs.get("shard_optimizer_state") and self._group is not None:
            raise ReplicatorError(
                "shard_optimizer_state=True needs the synchronous regime: with sync groups "
                "each group trains its own copy of the weights against the parameter store. "
                "Use Replicator() (sync) or drop shard_optimizer_state.")
        if is_distributed(optimizer):
            return optimizer
        return DistributedOptimizer(optimizer, **kwargs)

    # -- input ---------------------------------------------------------------------------------

    def distribute_dataset(self, input_fn: Callable[[InputContext], Any]) -> Iterator[PerReplica]:
        """Return an iterator of :class:`PerReplica` elements of ``input_fn(ctx)``'s datasets.

        Each call builds fresh datasets (``run(step_fn, input_fn)`` keeps its own). Pass the
        elements to ``run(step_fn, args=(element,))``. ``input_fn`` chooses each replica's data:
        its datasets are marked as already sharded (tf.data's ``auto_shard_policy`` OFF, see
        :mod:`hpcrep.tensorflow.presharded`), so transparent mode does not shard them again.
        Local.
        """
        iterators = [self._new_iterator(input_fn, i) for i in range(len(self.local_replica_ids))]

        class _Distributed:
            def __iter__(self) -> "_Distributed":
                return self

            def __next__(self) -> PerReplica:
                return PerReplica(tuple(next(it) for it in iterators))

        return _Distributed()

    def _new_iterator(self, input_fn: Callable[[InputContext], Any], local_index: int
                      ) -> Iterator:
        with tf.init_scope():  # created eagerly even while a tf.function traces run()
            dataset = input_fn(self._input_context(local_index))
            if isinstance(dataset, tf.data.Dataset):
                # input_fn already chose this replica's data: marked so, transparent mode
                # (`hpcrep run`) iterates it whole instead of sharding it by rank again.
                dataset = mark_presharded(dataset)
            return iter(dataset)

    def _iterator(self, input_fn: Callable[[InputContext], Any], local_index: int) -> Iterator:
        key = (id(input_fn), local_index)
        if key not in self._iterators:
            # Keep input_fn alive with its iterator, so that its id is not reused.
            self._iterators[key] = (self._new_iterator(input_fn, local_index), input_fn)
        return self._iterators[key][0]

    # -- running -------------------------------------------------------------------------------

    def run(self, step_fn: Callable[..., Any], input_fn: Optional[Callable] = None,
            args: tuple = (), kwargs: Optional[dict] = None) -> PerReplica:
        """Run ``step_fn`` once on every replica; return its results as a :class:`PerReplica`.

        With ``input_fn``, the next element of this replica's dataset (``input_fn(ctx)``, built
        once and cached) is passed as the first argument. :class:`PerReplica` values in ``args``
        and ``kwargs`` are unwrapped to each replica's own value. Inside ``step_fn``,
        :func:`~hpcrep.replicator.get_replica_context` gives the replica's primitives. In the
        asynchronous regime the group may then exchange parameters with the store.

        Collective: every replica that steps together must call this, in the same order.
        """
        self._check_open()
        kwargs = dict(kwargs or {})
        results = []
        mark_step("replicator", "begin")  # the timeline's step boundaries (when it records)
        with comm.using(self._communicator):
            for i in range(len(self.local_replica_ids)):
                call_args = tuple(_select(a, i) for a in args)
                call_kwargs = {k: _select(v, i) for k, v in kwargs.items()}
                if input_fn is not None:
                    call_args = (next(self._iterator(input_fn, i)),) + call_args
                with ctx_mod.active(self._replica_context(i)):
                    results.append(step_fn(*call_args, **call_kwargs))
            if self._group:
                # Stateful ops already run in program order inside tf.function; tying the
                # exchange to the step's results also keeps it after steps of only pure ops.
                deps = [t for t in tf.nest.flatten(results) if isinstance(t, tf.Tensor)]
                with tf.control_dependencies(deps):
                    self._group.after_step()
        mark_step("replicator", "end", after=results)
        return PerReplica(tuple(results))

    def reduce(self, op: Any, value: Any, axis: Optional[int] = None) -> Any:
        """Combine a per-replica ``value`` (nest allowed) over the replicas that step together.

        Args:
            op: ``"sum"``, ``"mean"``, ``"min"`` or ``"max"``.
            value: a :class:`PerReplica` (or a plain value: this rank's replica's value).
            axis: also reduce along this axis of each value; ``"mean"`` then averages over every
                element of every replica (replicas with more rows weigh more).

        Collective: every replica that steps together must call this, in the same order.
        """
        self._check_open()
        reduce_op = as_op(op)
        per = value.values if isinstance(value, PerReplica) else (value,)
        structure = per[0]
        flat = [[tf.convert_to_tensor(t) for t in tf.nest.flatten(v)] for v in per]
        outputs = []
        with comm.using(self._communicator):
            for j in range(len(flat[0])):
                local = tf.stack([f[j] for f in flat])  # [local replicas, ...]
                outputs.append(self._reduce_one(reduce_op, local, axis))
        return tf.nest.pack_sequence_as(structure, outputs)

    def _reduce_one(self, op: Any, local: tf.Tensor, axis: Optional[int]) -> tf.Tensor:
        from hpcrep.comm.ops import ReduceOp  # noqa: PLC0415

        axes = [0] if axis is None else [0, (axis % (local.shape.rank - 1)) + 1]
        if op is ReduceOp.Average:
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(local), axes)), local.dtype)
            total, count = collectives.grouped_allreduce(
                [tf.reduce_sum(local, axes), count], op=ReduceOp.Sum, name="replicator.reduce")
            return total / count
        combine = {ReduceOp.Sum: tf.reduce_sum, ReduceOp.Min: tf.reduce_min,
                   ReduceOp.Max: tf.reduce_max}[op]
        return collectives.allreduce(combine(local, axes), op=op, name="replicator.reduce")

    def local_results(self, value: Any) -> tuple:
        """Return the values of a :class:`PerReplica` for the replicas this rank runs. Local."""
        return value.values if isinstance(value, PerReplica) else (value,)

    # -- asynchronous regime -------------------------------------------------------------------

    def join(self) -> Any:
        """Asynchronous regime: push every group's last update and adopt the store's parameters.

        Afterwards every replica of the job holds the same trainable variables. Returns each
        group's step count (numpy int64 array). In the synchronous regime it does nothing and
        returns an empty array.

        Collective: every rank of the job must call this (the one point where groups wait).
        """
        self._check_open()
        import numpy as np  # noqa: PLC0415

        return self._group.join() if self._group else np.zeros(0, np.int64)

    def peek_group_steps(self) -> Any:
        """Asynchronous regime: every group's step count as the store holds it now (numpy int64;
        counts advance at exchanges). Empty in the synchronous regime. Local: reads the store
        without involving any other rank.
        """
        import numpy as np  # noqa: PLC0415

        if not self._group or self._group.store is None:
            return np.zeros(0, np.int64)
        return self._group.store.read()[1]

    def group_stats(self) -> dict:
        """Asynchronous regime: steps of every group at this group's last exchange, the largest
        step difference between groups seen at any exchange, this rank's exchange count, and
        which parameter store runs (``"window"`` or ``"p2p"``). Local.
        """
        if not self._group:
            return {"group_steps": [], "max_divergence": 0, "exchanges": 0}
        g = self._group
        return {"group_id": g.layout.group_id, "group_steps": g.group_steps.tolist(),
                "max_divergence": g.max_divergence, "exchanges": g.exchanges,
                "param_store": g.store.kind if g.store is not None else None}

    def store_ledger(self) -> dict:
        """Asynchronous regime: the store's first parameters (``initial``), the sum of the deltas
        this rank pushed (``pushed``; zeros on ranks that are not their group's first) and the
        store's parameters now (``store``), as flat float64 numpy arrays. Once every group has
        pushed its last delta (after :meth:`join`), ``store`` is ``initial`` plus the sum of
        ``pushed`` over the ranks. Empty in the synchronous regime. Local: reads the store
        without involving any other rank.
        """
        if not self._group or self._group.store is None:
            return {}
        g = self._group
        return {"initial": g.initial.copy(), "pushed": g.pushed.copy(),
                "store": g.store.read()[0].copy()}

    def close(self) -> None:
        """Release the regime's resources (the asynchronous regime's store and group).

        Collective: every rank must call this. A closed Replicator cannot run again.
        """
        if self._closed:
            return
        if self._group:
            self._group.close()
        self._mesh.free()
        self._iterators.clear()
        self._closed = True

    def __enter__(self) -> "Replicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ReplicatorError("this Replicator is closed; create a new one to run again")


def _select(value: Any, index: int) -> Any:
    return value.values[index] if isinstance(value, PerReplica) else value
