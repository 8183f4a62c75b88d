"""``join()``: the waiting side of uneven data (:mod:`hpcrep.comm.uneven` holds the active side).

A rank that has no more batches calls :func:`join`. Until every rank has joined, it takes part in
each agreement the active ranks run (:func:`hpcrep.comm.uneven.agree`), learns the collective's
signature from the lowest active rank, and replays that collective with zeros (allreduce) or no
rows (allgather). It lives apart from :mod:`hpcrep.comm.uneven` because replaying needs
:mod:`hpcrep.comm.collectives`, which itself needs the agreement: this way the imports run one
way (join -> collectives -> uneven).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcrep import config
from hpcrep.comm import check, collectives, flight, uneven, world
from hpcrep.errors import CollectiveMismatchError, ConfigError


def join() -> int:
    """Wait until every rank has joined, taking part in the others' collectives meanwhile.

    Returns the highest rank among the last ones to join (the same on every rank): the ranks
    that took part in the most collective rounds as active ranks (:func:`uneven.active_rounds`,
    which counts the compiled path's rounds too).

    Collective: every rank must call this once it has no more work; see
    :mod:`hpcrep.comm.uneven` for what the other ranks may run meanwhile.

    Raises:
        ConfigError: ``HPCREP_CHECK_COLLECTIVES`` is off (join rides on the agreement check).
        JoinError: an active rank ran a collective that cannot run without this rank.
        CollectiveMismatchError: the active ranks passed mismatched collectives.
    """
    from mpi4py import MPI  # noqa: PLC0415

    if not config.get("HPCREP_CHECK_COLLECTIVES"):
        raise ConfigError("hpcrep join() needs HPCREP_CHECK_COLLECTIVES=1 (the default): the "
                          "waiting rank learns the others' collectives from that check.")
    comm = world.comm()
    uneven.begin_join_mode()
    while True:
        none = uneven.NONE
        control = np.array([none, none, 1, none, none, none, none], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, control, op=MPI.MAX)
        if int(control[3]) == none:  # nobody active: every rank has joined
            uneven.end_join_mode()
            return _last_to_join(comm)
        if int(control[0]) != -int(control[1]):
            signatures = [s for s in comm.allgather(None) if s is not None]
            flight.mismatch(comm)  # as the active ranks do (hpcrep.comm.uneven.agree)
            raise CollectiveMismatchError(check.mismatch_message(signatures))
        _replay(comm.bcast(None, root=-int(control[4])))


def _last_to_join(comm: Any) -> int:
    """Return the highest rank among those with the most active rounds. Collective."""
    from mpi4py import MPI  # noqa: PLC0415

    size = comm.Get_size()
    key = np.array([uneven.active_rounds() * size + comm.Get_rank()], dtype=np.int64)
    uneven.restart_active_rounds()
    comm.Allreduce(MPI.IN_PLACE, key, op=MPI.MAX)
    return int(key[0]) % size


def _replay(signature: check.Signature) -> None:
    """Take part in the active ranks' collective with zeros (allreduce) or no rows (allgather).

    Collective: the active ranks run the collective of ``signature`` meanwhile.
    """
    uneven.require_supported(signature, waiting=True)
    kind, params, entries = signature
    arrays = [np.zeros(tuple(0 if d < 0 else d for d in shape), dtype=_dtype(dtype))
              for _, dtype, shape in entries]
    with uneven.replay():
        if kind == "allreduce":
            collectives.allreduce_into_buckets(arrays, collectives.plan_of(arrays), *params[:3])
        else:
            collectives.grouped_allgatherv(arrays)


def _dtype(name: str) -> np.dtype:
    """Return the numpy dtype named ``name`` (bfloat16 from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
