"""Replicas of several ranks: the job's ranks as a mesh of replicas x shards.

With ``ranks_per_replica = k`` the ranks form ``size // k`` replicas of k consecutive ranks:
replica ``r`` is job ranks ``r*k .. r*k + k - 1``, and rank ``r*k + s`` holds shard ``s`` of
the replica's sharded (tensor-parallel) variables. Consecutive ranks share a node whenever the
launcher fills nodes in order (``mpirun`` and ``srun`` do by default), so the replica's frequent
exchanges stay on the node.

Two communicators per rank, made by :func:`split`:

- ``model_parallel``: this replica's ranks, in shard order. The sharded layers exchange
  activations on it every step.
- ``data_parallel``: the ranks with this rank's shard index, one per replica, in replica order.
  Gradients are averaged on it: a replicated variable's gradient is the same on every rank of a
  replica, so averaging it over the ranks of shard ``s`` averages it over the replicas; a
  sharded variable's gradient only means something among the ranks holding the same shard.

Both are ordinary :class:`~hpcrep.comm.communicator.Communicator` objects: pass them as
``communicator=`` to :mod:`hpcrep.comm` or as ``process_set=`` to an ``hvd.*`` collective or
``DistributedOptimizer``. ``k = 1`` gives today's data parallelism (``data_parallel`` is the
parent itself); ``k = size`` one replica of every rank (``model_parallel`` is the parent).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional

from hpcrep.comm import check, world
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.communicator import split as split_communicator
from hpcrep.errors import CollectiveArgumentError


@dataclasses.dataclass(frozen=True)
class Mesh:
    """Where this rank sits among replicas of ``ranks_per_replica`` ranks.

    Attributes:
        ranks_per_replica: ranks in a replica (the number of shards of a sharded variable).
        replica_id: this rank's replica, ``0 .. num_replicas - 1``.
        num_replicas: replicas in the job.
        shard_index: this rank's place in its replica, ``0 .. ranks_per_replica - 1``.
        model_parallel: this replica's ranks (the sharded layers' exchanges).
        data_parallel: the ranks with this shard index, one per replica (gradient averaging).
        parent: the communicator that was split.
    """

    ranks_per_replica: int
    replica_id: int
    num_replicas: int
    shard_index: int
    model_parallel: Communicator
    data_parallel: Communicator
    parent: Communicator
    owned: tuple = dataclasses.field(default=(), repr=False)

    @property
    def num_shards(self) -> int:
        """Shards of a sharded variable: ``ranks_per_replica``."""
        return self.ranks_per_replica

    def free(self) -> None:
        """Free the communicators :func:`split` made (never the parent).

        Collective: every rank of the parent must call this.
        """
        for communicator in self.owned:
            communicator.free()


def layout_problem(size: int, ranks_per_replica: Any) -> str:
    """Return why ``size`` ranks cannot form replicas of ``ranks_per_replica``, or ''. Local.

    The message says what to do: another rank count, or a ``ranks_per_replica`` that divides it.
    """
    k = ranks_per_replica
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        return (f"ranks_per_replica must be a positive integer, got {type(k).__name__} {k!r}; "
                "pass the number of ranks that hold one replica (1: data parallel only).")
    if k < 1:
        return (f"ranks_per_replica must be >= 1, got {k}; pass the number of ranks that hold "
                "one replica (1: data parallel only).")
    if size % k:
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        counts = sorted({k * max(1, size // k), k * (size // k + 1)})
        return (f"ranks_per_replica={k} must divide the number of ranks, but the job has {size} "
                f"rank(s); start a multiple of {k} ranks (e.g. "
                f"{' or '.join(f'mpirun -n {c}' for c in counts)}) or choose ranks_per_replica "
                f"among {divisors}.")
    return ""


def split(ranks_per_replica: int, parent: Optional[Communicator] = None) -> Mesh:
    """Split ``parent`` (default: the job) into replicas of ``ranks_per_replica`` consecutive
    ranks; return this rank's :class:`Mesh`. Free it with :meth:`Mesh.free`.

    The ranks first agree on ``ranks_per_replica`` (a rank passing another value is an error on
    every rank), then the value is checked (the same answer everywhere).

    Raises:
        CollectiveMismatchError: ranks passed different ``ranks_per_replica`` (on every rank).
        CollectiveArgumentError: ``ranks_per_replica`` is not a positive integer that divides
            the parent's size (on every rank; the message says what to change).

    Collective: every rank of ``parent`` must call this, in the same order.
    """
    parent = world.communicator() if parent is None else parent
    k = ranks_per_replica
    given = int(k) if isinstance(k, numbers.Integral) and not isinstance(k, bool) else repr(k)
    check.agree(parent.comm, ("mesh.split", (f"ranks_per_replica={given}",), ()))
    problem = layout_problem(parent.size(), ranks_per_replica)
    if problem:
        raise CollectiveArgumentError(problem)
    k, size, me = int(ranks_per_replica), parent.size(), parent.rank()
    replica, shard = divmod(me, k)
    owned = []
    if k == size:
        model_parallel = parent
    else:
        members = [parent.ranks[replica * k + s] for s in range(k)]
        model_parallel = split_communicator(parent, replica, members, f"replica {replica}")
        owned.append(model_parallel)
    if k == 1:
        data_parallel = parent
    else:
        members = [parent.ranks[r * k + shard] for r in range(size // k)]
        data_parallel = split_communicator(parent, shard, members, f"shard {shard} group")
        owned.append(data_parallel)
    return Mesh(k, replica, size // k, shard, model_parallel, data_parallel, parent, tuple(owned))
