"""A parameter store on one rank, read and updated by any rank without the host's help.

The store is a flat float64 vector in an MPI window (``MPI.Win.Allocate``) on the host rank, plus
one step counter per writer (sync group) at its end. A writer calls :meth:`ParamStore.exchange`:
under a passive-target exclusive lock on the host it atomically adds its *delta* (how far its
parameters moved since its last exchange, times a scale) and its new steps with one
``MPI_Get_accumulate`` and receives the vector as it was before the add; adding the delta locally
gives the store's new value, which the writer adopts. No other rank takes part, so writers
progress at their own rates (Downpour-style asynchronous SGD with parameter deltas).

Progress: on one node Open MPI and MPICH serve passive-target operations through shared memory,
so the host need not be inside MPI (measured: 100 exchanges complete while the host sleeps). Over
networks without RDMA an MPI may progress them only when the host calls MPI; the host's own
exchanges then provide that progress.

Where this MPI has no one-sided window over the ranks (Open MPI 4.1 over TCP across nodes),
:func:`open_store` gives the point-to-point store of :mod:`hpcrep.comm.param_store_p2p` instead,
which keeps the same methods and the same atomicity (``HPCREP_PARAM_STORE`` chooses).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Union

import numpy as np

from hpcrep import config
from hpcrep.comm.param_store_p2p import P2PParamStore, initial_vector
from hpcrep.errors import CollectiveArgumentError, ConfigError, OneSidedUnavailableError

_STORE_CODES = {"auto": 0, "window": 1, "p2p": 2}
_announced: set[str] = set()


class ParamStore:
    """``num_params`` float64 parameters and ``num_writers`` step counters on rank ``host``.

    Args:
        comm: communicator of every rank that may exchange (mpi4py).
        num_params: length of the parameter vector.
        num_writers: number of step counters (one per sync group).
        initial: the host's initial parameters (ignored on other ranks).
        host: rank of ``comm`` that holds the memory.

    Collective (construction and :meth:`free`): every rank of ``comm`` must call them.
    """

    kind = "window"

    def __init__(self, comm: Any, num_params: int, num_writers: int,
                 initial: Optional[np.ndarray] = None, host: int = 0) -> None:
        from mpi4py import MPI  # noqa: PLC0415

        if num_params < 0 or num_writers < 1:
            raise CollectiveArgumentError(
                f"ParamStore needs num_params >= 0 and num_writers >= 1, got {num_params} and "
                f"{num_writers}")
        self._MPI = MPI
        self.comm, self.host = comm, int(host)
        self.num_params, self.num_writers = int(num_params), int(num_writers)
        self._length = self.num_params + self.num_writers
        is_host = comm.Get_rank() == self.host
        try:
            self._win = MPI.Win.Allocate(self._length * 8 if is_host else 0, 8, comm=comm)
        except MPI.Exception as exc:
            raise OneSidedUnavailableError(
                "the parameter store of Replicator's asynchronous regime (SyncGroups) needs an "
                f"MPI one-sided window over {comm.Get_size()} ranks, and this MPI cannot create "
                f"one ({exc.Get_error_string()}). Open MPI 4.1 over TCP has none that works "
                "across nodes with MPI_THREAD_MULTIPLE (osc/pt2pt refuses that thread level; "
                "osc/rdma needs RDMA hardware). Run the asynchronous regime within one node, use "
                "an MPI with one-sided support on this network (Open MPI with UCX, or MPICH), or "
                "use the synchronous regime.") from None
        if is_host:
            start = initial_vector(initial, self.num_params, self._length)
            self._win.Lock(self.host, MPI.LOCK_EXCLUSIVE)
            self._win.Put(start, self.host)
            self._win.Unlock(self.host)
        comm.Barrier()

    def exchange(self, delta: np.ndarray, writer: int, new_steps: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Add ``delta`` to the parameters and ``new_steps`` to counter ``writer``, atomically.

        Returns:
            ``(params, steps)``: the store's parameters and every writer's step count just after
            this update (float64 and int64 arrays of this process).

        Local: only the calling rank and the store's memory take part.
        """
        delta = np.asarray(delta, np.float64).reshape(-1)
        if delta.size != self.num_params or not 0 <= writer < self.num_writers:
            raise CollectiveArgumentError(
                f"ParamStore.exchange expects a delta of {self.num_params} values and a writer in "
                f"0..{self.num_writers - 1}; got {delta.size} values and writer {writer}")
        update = np.zeros(self._length, np.float64)
        update[:self.num_params] = delta
        update[self.num_params + writer] = float(new_steps)
        before = np.empty_like(update)
        MPI = self._MPI
        self._win.Lock(self.host, MPI.LOCK_EXCLUSIVE)
        self._win.Get_accumulate(update, before, self.host, op=MPI.SUM)
        self._win.Unlock(self.host)
        after = before + update
        return after[:self.num_params], after[self.num_params:].astype(np.int64)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(params, steps)`` as the store holds them now. Local."""
        out = np.empty(self._length, np.float64)
        MPI = self._MPI
        self._win.Lock(self.host, MPI.LOCK_SHARED)
        self._win.Get(out, self.host)
        self._win.Unlock(self.host)
        return out[:self.num_params], out[self.num_params:].astype(np.int64)

    def free(self) -> None:
        """Release the window. Collective: every rank of ``comm`` must call this."""
        if self._win is not None:
            self._win.Free()
            self._win = None


def windows_available(comm: Any) -> bool:
    """Return True if this MPI can create a one-sided window over ``comm`` (as ParamStore needs).

    Collective: every rank of ``comm`` must call this; all get the same answer.
    """
    from mpi4py import MPI  # noqa: PLC0415

    try:
        win = MPI.Win.Allocate(8 if comm.Get_rank() == 0 else 0, 8, comm=comm)
    except MPI.Exception:
        ok = 0
    else:
        win.Free()
        ok = 1
    return bool(comm.allreduce(ok, op=MPI.MIN))


def open_store(comm: Any, num_params: int, num_writers: int,
               initial: Optional[np.ndarray] = None, host: int = 0
               ) -> Union[ParamStore, P2PParamStore]:
    """Create the parameter store that ``HPCREP_PARAM_STORE`` asks for (same arguments as
    :class:`ParamStore`); rank 0 of ``comm`` says once which store runs.

    ``auto`` (the default): the window store where this MPI can create a one-sided window over
    ``comm`` (:func:`windows_available`), else the point-to-point store. ``window`` raises
    :class:`OneSidedUnavailableError` where there is none; ``p2p`` always serves the store from
    a thread on ``host``.

    Collective: every rank of ``comm`` must call this, in the same order.

    Raises:
        ConfigError: (on every rank) the ranks hold different values of ``HPCREP_PARAM_STORE``.
    """
    from mpi4py import MPI  # noqa: PLC0415

    choice = config.get("HPCREP_PARAM_STORE")
    code = np.array([_STORE_CODES[choice], -_STORE_CODES[choice]], np.int64)
    comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)  # set after init too (tests): agree anyway
    if int(code[0]) != -int(code[1]):
        raise ConfigError(
            "HPCREP_PARAM_STORE differs between ranks (this rank: "
            f"{choice!r}); the stores make different MPI calls. Set the same value on every "
            "rank, or unset it everywhere for 'auto'.")
    reason = f"HPCREP_PARAM_STORE={choice}"
    if choice == "auto":
        windowed = windows_available(comm)
        choice = "window" if windowed else "p2p"
        reason = ("this MPI creates one-sided windows over these ranks" if windowed else
                  "this MPI cannot create a one-sided window over these ranks")
    cls = ParamStore if choice == "window" else P2PParamStore
    store = cls(comm, num_params, num_writers, initial, host=host)
    if comm.Get_rank() == 0 and choice not in _announced:
        _announced.add(choice)
        where = ("an MPI one-sided window on rank" if choice == "window" else
                 "a server thread answering point-to-point requests on rank")
        print(f"hpcrep: asynchronous regime's parameter store: {choice} ({where} {host}; "
              f"{reason})", file=sys.stderr, flush=True)
    return store
