"""Uneven data, the active ranks' side: the agreement that also serves ranks waiting in join.

A rank that runs out of batches calls :func:`hpcrep.comm.join.join` (which holds the waiting
rank's side); the others carry on without it. While a rank waits in join, the other ranks'
allreduces complete with its contribution absent (it adds zeros, so Average still divides by the
full ``size``, as in Horovod) and their allgathers with no rows from it. join returns on every
rank once all ranks have joined, with the same value everywhere: the highest rank among the last
ones to join.

How: the agreement check that precedes every collective (:func:`agree`, one small MAX allreduce)
carries two more facts, "some rank is waiting in join" and "which ranks are active". A waiting
rank takes part in each such check; when it does, the lowest active rank broadcasts the
collective's signature (kind, parameters, dtypes and shapes), and the waiting rank replays that
collective with zeros (or zero rows). When every rank takes part as a waiting rank, all have
joined. Without waiting ranks the check costs what :func:`hpcrep.comm.check.agree` costs.

Supported while a rank waits: allreduce (Sum and Average) and allgather. Any other collective,
or another reduction, raises :class:`~hpcrep.errors.JoinError` on every rank. Object collectives
and barriers have no agreement check, so they must not run while a rank waits.
Requires ``HPCREP_CHECK_COLLECTIVES`` (the default).

This module holds the protocol both sides share (the control vector, the join-mode hooks, the
replay flag); it never imports :mod:`hpcrep.comm.collectives`, which imports it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from hpcrep.comm import check, flight, stragglers, watchdog
from hpcrep.errors import CollectiveMismatchError, JoinError

# The control vector every agreement reduces with MAX: [h, -h, someone waits, highest active
# rank, -lowest active rank, and the two entries of hpcrep.comm.stragglers: who waited least in
# the previous agreement, the longest wait]. A waiting rank sends NONE (neutral for MAX) where it
# has nothing.
NONE = np.iinfo(np.int64).min
_SUPPORTED = {"allreduce": ("Sum", "Average"), "allgather": None}

_state = threading.local()
_join_hooks: list[tuple[Callable[[], None], Callable[[], None], Callable[[], int]]] = []
# Agreements this rank took part in as an active rank: equal on every rank until one joins, so
# the ranks that join last have the highest count (hpcrep.comm.join.join's return value). The
# second entry is the count (hooks' rounds included) when the latest join ended on every rank:
# from then on every rank counts the same rounds again.
_active_rounds: list[int] = [0, 0]


def replaying() -> bool:
    """Return True while this rank replays, with zeros, a collective that active ranks run."""
    return getattr(_state, "replaying", False)


@contextlib.contextmanager
def replay() -> Iterator[None]:
    """Mark this thread as replaying (:func:`replaying`) for the duration: its collectives then
    skip their own agreement, which the waiting rank has already taken part in. Local."""
    _state.replaying = True
    try:
        yield
    finally:
        _state.replaying = False


def active_rounds() -> int:
    """Return how many collective rounds this rank has taken part in as an active rank (not
    waiting in join) since the latest join ended (:func:`restart_active_rounds`): its own
    agreements plus the rounds of the :func:`on_join` hooks' threads. Every rank counts the same
    rounds until it joins, so the count orders the ranks by when they joined. Local."""
    return _total_rounds() - _active_rounds[1]


def restart_active_rounds() -> None:
    """Count :func:`active_rounds` from now on: called when a join has ended on every rank,
    the point from which every rank takes part in the same rounds again. Local."""
    _active_rounds[1] = _total_rounds()


def _total_rounds() -> int:
    return _active_rounds[0] + sum(rounds() for _, _, rounds in _join_hooks)


def begin_join_mode() -> None:
    """Call every ``begin`` hook of :func:`on_join`: this rank starts waiting. Local."""
    for begin, _, _ in _join_hooks:
        begin()


def end_join_mode() -> None:
    """Call every ``end`` hook of :func:`on_join`: every rank has joined. Local."""
    for _, end, _ in _join_hooks:
        end()


def agree(comm: Any, signature: check.Signature) -> None:
    """:func:`hpcrep.comm.check.agree`, serving ranks that wait in join too.

    Collective: every rank of ``comm`` must call this (or wait in :func:`hpcrep.comm.join.join`),
    in order.

    Raises:
        CollectiveMismatchError: the active ranks passed different signatures.
        JoinError: ranks are waiting in join and this collective cannot run without them.
    """
    from mpi4py import MPI  # noqa: PLC0415

    h = check.signature_hash(signature)
    me = comm.Get_rank()
    control = np.array([h, -h, 0, me, -me, *stragglers.entries(comm)], dtype=np.int64)
    started = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, control, op=MPI.MAX)
    stragglers.after(comm, int(control[5]), int(control[6]), time.perf_counter() - started,
                     len(watchdog.hosts()), watchdog.hosts())
    _active_rounds[0] += 1
    if int(control[0]) != -int(control[1]):
        signatures = [s for s in comm.allgather(signature) if s is not None]
        flight.mismatch(comm)  # every rank writes its last collectives; the summary says where
        raise CollectiveMismatchError(check.mismatch_message(signatures))
    if control[2]:
        comm.bcast(signature if me == -int(control[4]) else None, root=-int(control[4]))
        require_supported(signature)


def on_join(begin: Callable[[], None], end: Callable[[], None],
            rounds: Callable[[], int] = lambda: 0) -> None:
    """Have :func:`hpcrep.comm.join.join` call ``begin()`` when this rank starts waiting and
    ``end()`` once every rank has joined: for communication threads outside this module (the
    compiled TensorFlow path), which must serve the active ranks' collectives too. ``rounds()``
    says how many collective rounds the thread ran with work of this rank's own (see
    :func:`active_rounds`). Local.
    """
    _join_hooks.append((begin, end, rounds))


def _leave_join_everywhere(waiting: bool) -> None:
    """Bring the join hooks' threads out of join mode on every rank, before a JoinError.

    A JoinError is raised on every rank (active ones in :func:`agree`, waiting ones in
    :func:`hpcrep.comm.join.join`), and the job carries on, so each active rank enters join mode
    and every rank waits until all have: the threads then leave it together, as when every rank
    has joined. A ``waiting`` rank's threads are in join mode already; entering it again could
    come after they have left it with the others (the active ranks' threads may finish that
    round before this rank's replay gets here), and they would then wait alone for good.
    """
    for begin, end, _ in _join_hooks:
        if not waiting:
            begin()
        end()


def require_supported(signature: check.Signature, waiting: bool = False) -> None:
    """Raise :class:`JoinError` unless ``signature``'s collective can run while a rank waits in
    join (allreduce Sum or Average, allgather); first bring this rank's join hooks out of join
    mode, as every rank raises together. ``waiting``: this rank is the one waiting in join (its
    hooks are in join mode already). Local (every rank reaches it with the same signature).
    """
    kind, params, _ = signature
    supported = kind in _SUPPORTED and (_SUPPORTED[kind] is None
                                        or params[0] in _SUPPORTED[kind])
    if not supported:
        _leave_join_everywhere(waiting)
    if kind not in _SUPPORTED:
        raise JoinError(f"hpcrep.{kind} cannot run while a rank waits in join(): only allreduce "
                        "(Sum, Average) and allgather can. Run it before any rank joins, or "
                        "after join() returns on every rank.")
    ops = _SUPPORTED[kind]
    if ops is not None and params[0] not in ops:
        raise JoinError(f"hpcrep.{kind} with op={params[0]} cannot run while a rank waits in "
                        f"join(): a waiting rank adds zeros, which only {' and '.join(ops)} "
                        "ignore.")
