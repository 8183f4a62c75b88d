"""Sync groups: splitting hpcrep's world into independent groups of ranks, and running in one.

TF-Replicator's asynchronous regime partitions the replicas into *sync groups*: ranks in a group
all-reduce with each other in lockstep, and no collective spans two groups, so one slow group
cannot stall another. :func:`split` makes the group communicators (contiguous blocks of ranks,
as equal as possible); :func:`make_world` and :func:`swap` make a group hpcrep's world, so every
collective of :mod:`hpcrep.comm` (and everything built on it, such as ``hpcrep.tensorflow``) runs
inside the group, exactly as if ``hpcrep.comm.init(comm=group)`` had been called; swapping the
returned world back restores the previous one. The switch is process-wide (not per thread): TensorFlow runs host callbacks of a
``tf.function`` on its own threads, and they must see the group too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hpcrep.comm import world
from hpcrep.errors import CollectiveArgumentError


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """Where this rank sits among the sync groups.

    Attributes:
        group_id: index of this rank's group, ``0 .. num_groups - 1``.
        num_groups: number of groups.
        group_rank: rank within the group.
        group_size: ranks in the group.
        leaders: world rank of each group's rank 0, by group.
        parent: the communicator that was split (spans every group).
        group_comm: this rank's group communicator.
    """

    group_id: int
    num_groups: int
    group_rank: int
    group_size: int
    leaders: tuple[int, ...]
    parent: Any
    group_comm: Any


def assignment(size: int, num_groups: int) -> list[int]:
    """Return the group of each rank: contiguous blocks, the first ``size % num_groups`` larger.

    Raises:
        CollectiveArgumentError: ``num_groups`` is not between 1 and ``size``.
    """
    if not 1 <= int(num_groups) <= size:
        raise CollectiveArgumentError(
            f"num_groups must be between 1 and the number of ranks ({size}), got {num_groups}; "
            "every sync group needs at least one rank.")
    base, extra = divmod(size, int(num_groups))
    out: list[int] = []
    for g in range(int(num_groups)):
        out += [g] * (base + (g < extra))
    return out


def split(num_groups: int) -> GroupLayout:
    """Split hpcrep's current world into ``num_groups`` sync groups.

    Collective: every rank must call this, in the same order, with the same ``num_groups``.
    """
    parent = world.comm()
    groups = assignment(parent.Get_size(), num_groups)
    me = parent.Get_rank()
    group_comm = parent.Split(groups[me], me)
    leaders = tuple(groups.index(g) for g in range(int(num_groups)))
    return GroupLayout(groups[me], int(num_groups), group_comm.Get_rank(), group_comm.Get_size(),
                       leaders, parent, group_comm)


def make_world(layout: GroupLayout) -> Any:
    """Return an hpcrep world (communicator plus node-local and cross splits) for the group.

    Collective: every rank of the group must call this, in the same order.
    """
    from mpi4py import MPI  # noqa: PLC0415

    group = layout.group_comm
    local = group.Split_type(MPI.COMM_TYPE_SHARED, key=group.Get_rank())
    cross = group.Split(local.Get_rank(), group.Get_rank())
    return world._World(group, local, cross, owns_mpi=False)  # noqa: SLF001 - sibling module


def swap(new_world: Any) -> Any:
    """Make ``new_world`` (from :func:`make_world`, or a token this returned) hpcrep's world.

    Returns the world it replaced, to pass back to :func:`swap` later. Local, but every rank of
    the new world must switch before its next collective.
    """
    with world._lock:  # noqa: SLF001
        old = world._require()  # noqa: SLF001
        world._world = new_world  # noqa: SLF001
        return old


def free_world(group_world: Any) -> None:
    """Free the communicators of a world made by :func:`make_world` (not the group's own).

    Collective: every rank of the group must call this.
    """
    group_world.cross.Free()
    group_world.local.Free()
