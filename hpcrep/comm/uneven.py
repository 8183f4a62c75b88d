"""Uneven data: a rank that runs out of batches calls :func:`join`; the others carry on without it.

While a rank waits in :func:`join`, the other ranks' allreduces complete with its contribution
absent (it adds zeros, so Average still divides by the full ``size``, as in Horovod) and their
allgathers with no rows from it. :func:`join` returns on every rank once all ranks have joined,
with the same value everywhere: the highest rank among the last ones to join.

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
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np

from hpcrep import config
from hpcrep.comm import check
from hpcrep.errors import CollectiveMismatchError, ConfigError, JoinError

_NONE = np.iinfo(np.int64).min  # neutral for MAX
_SUPPORTED = {"allreduce": ("Sum", "Average"), "allgather": None}

_state = threading.local()
_join_hooks: list[tuple[Callable[[], None], Callable[[], None]]] = []
_last_active: list[Optional[int]] = [None]  # highest active rank in the latest control round


def replaying() -> bool:
    """Return True while this rank replays, with zeros, a collective that active ranks run."""
    return getattr(_state, "replaying", False)


def agree(comm: Any, signature: check.Signature) -> None:
    """:func:`hpcrep.comm.check.agree`, serving ranks that wait in :func:`join` too.

    Collective: every rank of ``comm`` must call this (or wait in :func:`join`), in order.

    Raises:
        CollectiveMismatchError: the active ranks passed different signatures.
        JoinError: ranks are waiting in join and this collective cannot run without them.
    """
    from mpi4py import MPI  # noqa: PLC0415

    h = check.signature_hash(signature)
    me = comm.Get_rank()
    control = np.array([h, -h, 0, me, -me], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, control, op=MPI.MAX)
    _last_active[0] = int(control[3])
    if int(control[0]) != -int(control[1]):
        signatures = [s for s in comm.allgather(signature) if s is not None]
        raise CollectiveMismatchError(check.mismatch_message(signatures))
    if control[2]:
        comm.bcast(signature if me == -int(control[4]) else None, root=-int(control[4]))
        _require_supported(signature)


def on_join(begin: Callable[[], None], end: Callable[[], None]) -> None:
    """Have :func:`join` call ``begin()`` when this rank starts waiting and ``end()`` once every
    rank has joined: for communication threads outside this module (the compiled TensorFlow
    path), which must serve the active ranks' collectives too. Local.
    """
    _join_hooks.append((begin, end))


def join() -> int:
    """Wait until every rank has joined, taking part in the others' collectives meanwhile.

    Returns the highest rank among the last ones to join (the same on every rank).

    Collective: every rank must call this once it has no more work; see the module docstring
    for what the other ranks may run meanwhile.

    Raises:
        ConfigError: ``HPCREP_CHECK_COLLECTIVES`` is off (join rides on the agreement check).
        JoinError: an active rank ran a collective that cannot run without this rank.
        CollectiveMismatchError: the active ranks passed mismatched collectives.
    """
    from mpi4py import MPI  # noqa: PLC0415

    from hpcrep.comm import world  # noqa: PLC0415

    if not config.get("HPCREP_CHECK_COLLECTIVES"):
        raise ConfigError("hpcrep join() needs HPCREP_CHECK_COLLECTIVES=1 (the default): the "
                          "waiting rank learns the others' collectives from that check.")
    comm = world.comm()
    for begin, _ in _join_hooks:
        begin()
    while True:
        control = np.array([_NONE, _NONE, 1, _NONE, _NONE], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, control, op=MPI.MAX)
        if int(control[3]) == _NONE:  # nobody active: every rank has joined
            for _, end in _join_hooks:
                end()
            last = _last_active[0]
            _last_active[0] = None
            return comm.Get_size() - 1 if last is None else last
        _last_active[0] = int(control[3])
        if int(control[0]) != -int(control[1]):
            signatures = [s for s in comm.allgather(None) if s is not None]
            raise CollectiveMismatchError(check.mismatch_message(signatures))
        _replay(comm.bcast(None, root=-int(control[4])))


def _leave_join_everywhere() -> None:
    """Bring the join hooks' threads out of join mode on every rank, before a JoinError.

    A JoinError is raised on every rank (active ones in :func:`agree`, waiting ones in
    :func:`join`), and the job carries on, so each rank enters join mode and waits until all
    have: the threads then leave it together, as when every rank has joined.
    """
    for begin, end in _join_hooks:
        begin()
        end()


def _require_supported(signature: check.Signature) -> None:
    kind, params, _ = signature
    supported = kind in _SUPPORTED and (_SUPPORTED[kind] is None
                                        or params[0] in _SUPPORTED[kind])
    if not supported:
        _leave_join_everywhere()
    if kind not in _SUPPORTED:
        raise JoinError(f"hpcrep.{kind} cannot run while a rank waits in join(): only allreduce "
                        "(Sum, Average) and allgather can. Run it before any rank joins, or "
                        "after join() returns on every rank.")
    ops = _SUPPORTED[kind]
    if ops is not None and params[0] not in ops:
        raise JoinError(f"hpcrep.{kind} with op={params[0]} cannot run while a rank waits in "
                        f"join(): a waiting rank adds zeros, which only {' and '.join(ops)} "
                        "ignore.")


def _replay(signature: check.Signature) -> None:
    """Take part in the active ranks' collective with zeros (allreduce) or no rows (allgather)."""
    from hpcrep.comm import collectives  # noqa: PLC0415 - collectives imports this module

    _require_supported(signature)
    kind, params, entries = signature
    arrays = [np.zeros(tuple(0 if d < 0 else d for d in shape), dtype=_dtype(dtype))
              for _, dtype, shape in entries]
    _state.replaying = True
    try:
        if kind == "allreduce":
            collectives.allreduce_into_buckets(arrays, collectives.plan_of(arrays), *params[:3])
        else:
            collectives.grouped_allgatherv(arrays)
    finally:
        _state.replaying = False


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
