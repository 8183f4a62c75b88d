"""Horovod process sets: named subsets of the job's ranks that run collectives on their own.

A :class:`ProcessSet` is a handle, as in Horovod: a sorted list of job ranks and, once
:func:`add_process_set` has registered it on every rank, a ``process_set_id``. Registration
splits the job's communicator (one :class:`~hpcrep.comm.communicator.Communicator` per set,
held by its members); collectives given ``communicator=process_set`` run on it, and a rank outside
the set that calls one gets a :class:`~hpcrep.errors.CollectiveArgumentError` (a ``ValueError``)
before anything is sent. :data:`global_process_set` (id 0) is the job itself.

Horovod semantics kept: ids are small integers, the smallest free one is reused after
:func:`remove_process_set`; adding a set with the ranks of a registered one (the global set
included) raises ``ValueError``; ``rank()`` is the rank inside the set (``ValueError`` outside
it), ``size()`` and ``rank()`` return None until the set is registered; ``root_rank`` arguments
stay job ranks (``hvd.rank()``), never ranks inside the set. Unlike Horovod no environment
variable is needed to add sets after :func:`hpcrep.comm.init`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Iterable, Optional, Union

from hpcrep.comm import check, world
from hpcrep.comm.communicator import Communicator, split
from hpcrep.errors import CollectiveArgumentError


@dataclasses.dataclass
class _Entry:
    ranks: tuple[int, ...]
    communicator: Optional[Communicator]  # None on ranks outside the set


_registry: dict[int, _Entry] = {}  # registered sets other than the global one, by id
_hooked = False  # _forget_all is registered to run at hpcrep's shutdown


class ProcessSet:
    """A set of job ranks that run collectives together (Horovod's ``hvd.ProcessSet``).

    Args:
        ranks_or_comm: job ranks (any order; kept sorted), or an mpi4py communicator (accepted
            for Horovod compatibility; hpcrep registers sets by ranks only).

    Attributes:
        process_set_id: the id given by :func:`add_process_set`; None until then and after
            :func:`remove_process_set`.
        ranks: sorted job ranks, or None for a set made from a communicator.
        mpi_comm: the communicator given, or None.

    Raises:
        CollectiveArgumentError: ``ranks_or_comm`` has entries that are not integers.
    """

    def __init__(self, ranks_or_comm: Union[Iterable[int], Any]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm: Any = None
        self._ranks: Optional[list[int]] = None
        if hasattr(ranks_or_comm, "Get_size") and hasattr(ranks_or_comm, "Split"):
            self.mpi_comm = ranks_or_comm
            return
        try:
            given = list(ranks_or_comm)
        except TypeError:
            raise CollectiveArgumentError(
                f"ProcessSet takes a list of job ranks or an mpi4py communicator, got "
                f"{type(ranks_or_comm).__name__}: {ranks_or_comm!r}") from None
        bad = [r for r in given if isinstance(r, bool) or not isinstance(r, numbers.Integral)]
        if bad:
            raise CollectiveArgumentError(
                f"ProcessSet ranks must be integers (job ranks as hvd.rank() gives them), got "
                f"{bad!r} in {given!r}")
        self._ranks = sorted(int(r) for r in given)

    @property
    def ranks(self) -> Optional[list[int]]:
        """Sorted job ranks of the set (None for a set given as a communicator)."""
        return None if self._ranks is None else list(self._ranks)

    def _entry(self) -> _Entry:
        entry = _registry.get(self.process_set_id) if self.process_set_id is not None else None
        if entry is None:
            raise CollectiveArgumentError(
                f"{self} is not registered (never added, or removed): every rank must call "
                "hvd.add_process_set(...) with it before it is used.")
        return entry

    def size(self) -> Optional[int]:
        """Return the number of ranks in the set; None if it is not registered. Local."""
        if self.process_set_id is None:
            return None
        return len(self._entry().ranks)

    def rank(self) -> Optional[int]:
        """Return this process's rank inside the set; None if the set is not registered.

        Collectives still take job ranks (``root_rank`` of broadcast is ``hvd.rank()`` of the
        root); this rank is for reading results such as an allgather's rows. Local.

        Raises:
            CollectiveArgumentError: this process is not in the set.
        """
        if self.process_set_id is None:
            return None
        return self.communicator().rank()

    def included(self) -> Optional[bool]:
        """Return True if this process is in the set; None if the set has no ranks. Local."""
        ranks = self.ranks
        return None if ranks is None else world.rank() in ranks

    def communicator(self) -> Communicator:
        """Return the set's communicator, for :mod:`hpcrep.comm` collectives. Local.

        Raises:
            CollectiveArgumentError: the set is not registered, or this process is not in it.
        """
        entry = self._entry()
        if entry.communicator is None:
            raise CollectiveArgumentError(
                f"this process (job rank {world.rank()}) is not in {self}: call collectives of a "
                "process set only on the ranks where process_set.included() is True.")
        return entry.communicator

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0); its ranks follow :func:`hpcrep.comm.init`."""

    def __init__(self) -> None:
        super().__init__([])
        self.process_set_id = 0

    @property
    def ranks(self) -> Optional[list[int]]:
        return list(range(world.size())) if world.is_initialized() else []

    def size(self) -> Optional[int]:
        return world.size()

    def communicator(self) -> Communicator:
        return world.communicator()


global_process_set: ProcessSet = _GlobalProcessSet()


def _agree_on(kind: str, described: str) -> None:
    """Raise CollectiveMismatchError on every rank unless all ranks pass an equal description."""
    check.agree(world.comm(), (kind, (described,), ()))


def add_process_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    """Register a process set on every rank and return it (with its ``process_set_id``).

    Args:
        process_set: a :class:`ProcessSet` or a list of job ranks.

    Raises:
        CollectiveMismatchError: ranks passed different sets (on every rank).
        CollectiveArgumentError: (on every rank) a rank outside the job, an empty set, a
            repeated rank, a set already registered, or the same ranks as a registered set
            (the global set included).
        NotImplementedError: a set given as an MPI communicator.

    Collective: every rank of the job must call this, in the same order, with the same ranks.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "hpcrep adds process sets by ranks only; build it as hvd.ProcessSet([job ranks]) "
            "instead of from an MPI communicator.")
    ranks = tuple(process_set.ranks)
    _agree_on("add_process_set",
              f"ranks={list(ranks)}, process_set_id={process_set.process_set_id}")
    problem = _problem(process_set, ranks)
    if problem:
        raise CollectiveArgumentError(f"add_process_set({list(ranks)}): {problem}")
    new_id = next(i for i in range(1, len(_registry) + 2) if i not in _registry)
    member = world.rank() in ranks
    communicator = split(world.communicator(), 0 if member else None, ranks,
                         f"process set {new_id}")
    global _hooked
    if not _hooked:
        world.at_shutdown(_forget_all)
        world.at_replace(_drop_all)
        _hooked = True
    _registry[new_id] = _Entry(ranks, communicator)
    process_set.process_set_id = new_id
    return process_set


def _problem(process_set: ProcessSet, ranks: tuple[int, ...]) -> str:
    """Return why ``ranks`` cannot be added (the same on every rank), or ''."""
    n = world.size()
    if not ranks:
        return "a process set needs at least one rank."
    if len(set(ranks)) != len(ranks):
        return "a rank appears more than once; list each job rank once."
    outside = [r for r in ranks if not 0 <= r < n]
    if outside:
        return f"ranks {outside} are not ranks of the job (0..{n - 1})."
    if process_set.process_set_id is not None:
        return (f"this ProcessSet is already registered with id {process_set.process_set_id}; "
                "remove it first or use it as it is.")
    if ranks == tuple(range(n)):
        return "these are all the job's ranks: a duplicate of hvd.global_process_set."
    for known_id, entry in _registry.items():
        if entry.ranks == ranks:
            return f"a duplicate of registered process set {known_id}."
    return ""


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` and free its communicator; return True if it was registered.

    The global set is never removed (False). Afterwards ``process_set.process_set_id`` is None
    and collectives on it raise; its id may be given to a later set.

    Collective: every rank of the job must call this, in the same order, with the same set.
    """
    set_id = process_set.process_set_id
    _agree_on("remove_process_set", f"process_set_id={set_id}")
    if set_id is None or set_id == 0 or set_id not in _registry:
        return False
    entry = _registry.pop(set_id)
    if entry.communicator is not None:
        entry.communicator.free()
    process_set.process_set_id = None
    return True


def registered() -> dict[int, list[int]]:
    """Return ``{process_set_id: ranks}`` of every registered set, the global one (0) included.

    Local.
    """
    out = {0: list(range(world.size()))}
    out.update({i: list(e.ranks) for i, e in sorted(_registry.items())})
    return out


def _drop_all() -> None:
    """When survivors replace the job's world (:func:`hpcrep.comm.world.replace`): every set's
    communicator holds the old world's ranks, so every set is dropped (ids become unknown) and
    its communicator forgotten without being freed. Local."""
    for entry in _registry.values():
        if entry.communicator is not None:
            entry.communicator.abandon()
    _registry.clear()


def _forget_all() -> None:
    """At shutdown: free every set's communicator and unregister it (ids become unknown)."""
    global _hooked
    _hooked = False
    for entry in _registry.values():
        if entry.communicator is not None:
            entry.communicator.free()
    _registry.clear()
