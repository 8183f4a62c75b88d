"""A parameter store served by a thread on the host rank, over point-to-point messages.

The same store as :class:`hpcrep.comm.param_store.ParamStore` (a float64 vector plus one step
counter per writer, on rank ``host``; :meth:`P2PParamStore.exchange` atomically adds a delta and
returns the store's new value; :meth:`P2PParamStore.read` a consistent snapshot), for MPIs that
have no one-sided window across these ranks (Open MPI 4.1 over TCP with
``MPI_THREAD_MULTIPLE``). A daemon thread on the host answers requests sent on a duplicate of
the communicator that is the store's alone: a client sends one message (the operation, the
writer, its new steps, the delta) and receives the store's value in reply. The thread handles
one request at a time, and the host's own exchanges take the same lock, so every exchange is
atomic, as under the window store's exclusive lock. The host also trains; nobody else waits for
it: its thread answers while its main thread computes or sleeps.

Waiting never spins a core: the thread polls with ``MPI_Iprobe`` and sleeps between polls,
longer the longer it has been idle (up to :data:`IDLE_SLEEP_MAX`); a client's reply is polled
the same way. It needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default), since the thread calls MPI
while the main thread does.

Shutdown: :meth:`P2PParamStore.free` (collective) waits until every rank has stopped exchanging,
sends the thread a stop request and frees the communicator. At interpreter exit a store never
freed has its thread stopped before MPI finalises. A client waiting for a reply that never comes
(the host died or hangs) is ended by the stall watchdog (``HPCREP_STALL_TIMEOUT``).
"""

from __future__ import annotations

import atexit
import itertools
import sys
import threading
import time
import weakref
from typing import Any, Optional

import numpy as np

from hpcrep.comm import watchdog
from hpcrep.errors import CollectiveArgumentError, ParamStoreUnavailableError

TAG_REQUEST = 7401       # client -> host: [op, writer, new_steps, delta...] (float64)
TAG_REPLY = 7402         # host -> client: the store's values (float64, params then counters)
OP_EXCHANGE, OP_READ, OP_STOP = 1.0, 2.0, 3.0
HEADER = 3
BUSY_POLLS = 32          # polls before the first sleep (a reply is often there at once)
IDLE_SLEEP_MIN = 20e-6   # seconds: first sleep between polls
IDLE_SLEEP_MAX = 2e-3    # seconds: longest sleep between polls (an idle server's latency)

_live: "weakref.WeakSet[P2PParamStore]" = weakref.WeakSet()
_exit_hook: list[bool] = []


def initial_vector(initial: Any, num_params: int, length: int) -> np.ndarray:
    """Return a store's starting contents: ``length`` float64 zeros with ``initial`` (None, or
    ``num_params`` values) in front; both stores lay out parameters, then step counters. Local.

    Raises:
        CollectiveArgumentError: ``initial`` does not have ``num_params`` entries.
    """
    values = np.zeros(length, np.float64)
    if initial is not None:
        flat = np.asarray(initial, np.float64).reshape(-1)
        if flat.size != num_params:
            raise CollectiveArgumentError(
                f"ParamStore initial values have {flat.size} entries, expected {num_params}")
        values[:num_params] = flat
    return values


def _pause(waited: float) -> float:
    """Seconds to sleep before the next poll after waiting ``waited`` seconds (grows to the cap)."""
    return min(max(waited / 16, IDLE_SLEEP_MIN), IDLE_SLEEP_MAX)


def _await(request: Any) -> None:
    """Complete ``request`` by polling ``MPI_Test`` with growing sleeps (no spinning). Local."""
    start = time.monotonic()
    for polls in itertools.count():
        if request.Test():
            return
        if polls >= BUSY_POLLS:
            time.sleep(_pause(time.monotonic() - start))


class P2PParamStore:
    """``num_params`` float64 parameters and ``num_writers`` step counters on rank ``host``,
    served by a thread there.

    Args:
        comm: communicator of every rank that may exchange (mpi4py); the store duplicates it.
        num_params: length of the parameter vector.
        num_writers: number of step counters (one per sync group).
        initial: the host's initial parameters (ignored on other ranks).
        host: rank of ``comm`` that holds the values and runs the thread.

    Collective (construction and :meth:`free`): every rank of ``comm`` must call them.

    Raises:
        ParamStoreUnavailableError: (on every rank) MPI was not initialised with
            ``MPI_THREAD_MULTIPLE``.
    """

    kind = "p2p"

    def __init__(self, comm: Any, num_params: int, num_writers: int,
                 initial: Optional[np.ndarray] = None, host: int = 0) -> None:
        from mpi4py import MPI  # noqa: PLC0415

        if num_params < 0 or num_writers < 1 or not 0 <= host < comm.Get_size():
            raise CollectiveArgumentError(
                f"ParamStore needs num_params >= 0, num_writers >= 1 and a host rank in "
                f"0..{comm.Get_size() - 1}, got {num_params}, {num_writers} and {host}")
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise ParamStoreUnavailableError(
                "the point-to-point parameter store needs MPI_THREAD_MULTIPLE (its server thread "
                "calls MPI while the main thread does), and MPI was initialised with thread "
                f"level {MPI.Query_thread()}. Leave mpi4py.rc.thread_level at its default "
                "('multiple') or set HPCREP_PARAM_STORE=window where one-sided windows work.")
        self._MPI = MPI
        self.comm, self.host = comm, int(host)
        self.num_params, self.num_writers = int(num_params), int(num_writers)
        self._length = self.num_params + self.num_writers
        self._is_host = comm.Get_rank() == self.host
        self._client_lock = threading.Lock()  # one request in flight per process
        self._values: Optional[np.ndarray] = None
        self._values_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.requests_served = 0
        if self._is_host:
            self._values = initial_vector(initial, self.num_params, self._length)
        self._comm = comm.Dup()
        self._comm.Set_name("hpcrep param store")
        if self._is_host:
            self._thread = threading.Thread(target=self._serve, name="hpcrep-param-store",
                                            daemon=True)
            self._thread.start()
            _live.add(self)
            if not _exit_hook:  # registered after mpi4py's own exit hook, so it runs before it
                _exit_hook.append(True)
                atexit.register(_stop_at_exit)

    # -- clients -------------------------------------------------------------------------------

    def exchange(self, delta: np.ndarray, writer: int, new_steps: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Add ``delta`` to the parameters and ``new_steps`` to counter ``writer``, atomically.

        Returns:
            ``(params, steps)``: the store's parameters and every writer's step count just after
            this update (float64 and int64 arrays of this process).

        Local: only the calling rank and the host's server thread take part.
        """
        delta = np.asarray(delta, np.float64).reshape(-1)
        if delta.size != self.num_params or not 0 <= writer < self.num_writers:
            raise CollectiveArgumentError(
                f"ParamStore.exchange expects a delta of {self.num_params} values and a writer in "
                f"0..{self.num_writers - 1}; got {delta.size} values and writer {writer}")
        request = np.empty(HEADER + self.num_params, np.float64)
        request[:HEADER] = (OP_EXCHANGE, writer, float(new_steps))
        request[HEADER:] = delta
        return self._split(self._ask(request))

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(params, steps)`` as the store holds them now.

        Local: only the calling rank and the host's server thread take part.
        """
        return self._split(self._ask(np.array([OP_READ, 0.0, 0.0])))

    def _split(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return values[:self.num_params], values[self.num_params:].astype(np.int64)

    def _ask(self, request: np.ndarray) -> np.ndarray:
        """Apply ``request`` on the host (directly there) and return the store's values."""
        if self._comm is None:
            raise CollectiveArgumentError("this ParamStore has been freed")
        if self._is_host:
            return self._apply(request)
        reply = np.empty(self._length, np.float64)
        MPI = self._MPI
        with self._client_lock, watchdog.watching("param store request", ("param_store",)):
            receiving = self._comm.Irecv([reply, MPI.DOUBLE], self.host, TAG_REPLY)
            _await(self._comm.Isend([request, MPI.DOUBLE], self.host, TAG_REQUEST))
            _await(receiving)
        return reply

    # -- host ----------------------------------------------------------------------------------

    def _apply(self, request: np.ndarray) -> np.ndarray:
        """Carry out one exchange or read on the host's values; return a copy of them after it."""
        with self._values_lock:
            values = self._values
            if request[0] == OP_EXCHANGE:
                values[:self.num_params] += request[HEADER:]
                values[self.num_params + int(request[1])] += request[2]
            return values.copy()

    def _serve(self) -> None:
        """The server thread: answer requests until a stop request; abort the job on a failure."""
        MPI = self._MPI
        comm, status = self._comm, MPI.Status()
        idle_since = time.monotonic()
        try:
            while True:
                if not comm.Iprobe(MPI.ANY_SOURCE, TAG_REQUEST, status):
                    time.sleep(_pause(time.monotonic() - idle_since))
                    continue
                source, count = status.Get_source(), status.Get_count(MPI.DOUBLE)
                request = np.empty(count, np.float64)
                comm.Recv([request, MPI.DOUBLE], source, TAG_REQUEST)
                if request[0] == OP_STOP:
                    return
                if count != (HEADER + self.num_params if request[0] == OP_EXCHANGE else HEADER):
                    raise RuntimeError(f"malformed request of {count} values from rank {source}")
                comm.Send([self._apply(request), MPI.DOUBLE], source, TAG_REPLY)
                self.requests_served += 1
                idle_since = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - a dead server would hang every client
            print(f"hpcrep: rank {comm.Get_rank()}: the parameter store's server thread failed "
                  f"({exc!r}); aborting the job, whose clients would otherwise wait forever.",
                  file=sys.stderr, flush=True)
            MPI.COMM_WORLD.Abort(1)

    def _stop_server(self) -> None:
        """Send this host's thread a stop request and wait for it to end. Local (host only)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        _live.discard(self)
        if thread.is_alive():
            self._comm.Send([np.array([OP_STOP, 0.0, 0.0]), self._MPI.DOUBLE], self.host,
                            TAG_REQUEST)
            thread.join()

    def free(self) -> None:
        """Stop the server and free the store's communicator.

        Waits (polling, not spinning) until every rank has called this, so no request is in
        flight when the server stops. Collective: every rank of ``comm`` must call this.
        """
        if self._comm is None:
            return
        with watchdog.watching("param store free", ("param_store",)):
            _await(self._comm.Ibarrier())
        self._stop_server()
        self._comm.Free()
        self._comm = None


def _stop_at_exit() -> None:
    # A store never freed (the script ended without Replicator.close()): its thread must not be
    # inside MPI when MPI finalises. Clients have nothing in flight once their process exits.
    from mpi4py import MPI  # noqa: PLC0415

    if MPI.Is_finalized():
        return
    for store in list(_live):
        store._stop_server()
