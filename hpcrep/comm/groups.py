"""Sync groups: splitting a communicator into independent groups of ranks.

TF-Replicator's asynchronous regime partitions the replicas into *sync groups*: ranks in a group
all-reduce with each other in lockstep, and no collective spans two groups, so one slow group
cannot stall another. :func:`split` makes the group communicators (contiguous blocks of ranks,
as equal as possible). A group is an ordinary :class:`~hpcrep.comm.communicator.Communicator`:
pass it as ``communicator=`` to a collective, or run code inside
``hpcrep.comm.current.using(layout.group)``; the job's world, :func:`hpcrep.comm.rank` and
:func:`hpcrep.comm.size` are never changed.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from hpcrep.comm import world
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.communicator import split as split_communicator
from hpcrep.errors import CollectiveArgumentError


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """Where this rank sits among the sync groups.

    Attributes:
        group_id: index of this rank's group, ``0 .. num_groups - 1``.
        num_groups: number of groups.
        group_rank: rank within the group.
        group_size: ranks in the group.
        leaders: job rank of each group's rank 0, by group.
        parent: the communicator that was split (spans every group).
        group: this rank's group communicator.
    """

    group_id: int
    num_groups: int
    group_rank: int
    group_size: int
    leaders: tuple[int, ...]
    parent: Communicator
    group: Communicator


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


def split(num_groups: int, parent: Optional[Communicator] = None) -> GroupLayout:
    """Split ``parent`` (default: the job's world) into ``num_groups`` sync groups.

    Free the group with ``layout.group.free()`` (collective within the group).

    Collective: every rank of ``parent`` must call this, in the same order, with the same
    ``num_groups``.
    """
    parent = world.communicator() if parent is None else parent
    groups = assignment(parent.size(), num_groups)
    mine = groups[parent.rank()]
    members = [parent.ranks[i] for i, g in enumerate(groups) if g == mine]
    group = split_communicator(parent, mine, members, f"sync group {mine}")
    leaders = tuple(parent.ranks[groups.index(g)] for g in range(int(num_groups)))
    return GroupLayout(mine, int(num_groups), group.rank(), group.size(), leaders, parent, group)
