"""Stall watchdog: a collective that never completes ends the job instead of hanging it.

A rank blocked in MPI cannot tell a slow peer from a dead one or from a cut network link: MPI over
TCP waits for as long as the kernel keeps the connection, which after a link failure is many
minutes, and a job sits in its allreduce until the batch system's time limit. Each collective of
:mod:`hpcrep.comm` therefore runs inside :func:`watching`, which records what this rank is waiting
for; a daemon thread checks that record once a second:

- after half of ``HPCREP_STALL_TIMEOUT`` it prints a warning and asks every other rank, on a
  communicator of its own, where it is (ranks whose watchdog also fired answer with the call they
  are blocked in; a rank that is computing, stuck outside hpcrep, dead or unreachable does not);
- after the whole timeout it prints what it knows (the collective, the tensor names, which ranks
  answered from which call, which did not and on which host they run) and aborts the job:
  ``MPI_Abort``, then ``os._exit`` if that has not ended the process a few seconds later (on a
  node that lost its link, ``MPI_Abort`` itself cannot reach the launcher). Before
  ``MPI_Abort`` it prints :func:`hpcrep.comm.abort.abort`'s notice line, from which hpcrep's
  launchers learn that the job is being aborted (:mod:`hpcrep.launch.supervise`).

A rank that is merely slow is not killed before the timeout: the clock starts when this rank
enters the collective and stops when the collective returns. ``HPCREP_STALL_TIMEOUT=0`` turns the
watchdog off. The cost per collective is two clock reads and two attribute writes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from hpcrep import config
from hpcrep.comm import flight
from hpcrep.comm.abort import abort as abort_job

EXIT_CODE = 75          # MPI_Abort's error code when a stall ends the job (EX_TEMPFAIL)
_STATUS_TAG = 7351      # tag of status messages on the watchdog's own communicator
_ANSWER_WINDOW = 5.0    # seconds the status query waits for answers
_ABORT_GRACE = 5.0      # seconds MPI_Abort gets before the process exits by itself


@dataclasses.dataclass
class _Call:
    """The collective this process is blocked in."""

    kind: str
    names: tuple[str, ...]
    seq: int
    started: float
    timeout: float
    warned: bool = False


@dataclasses.dataclass
class _State:
    comm: Any = None                  # private duplicate for status queries (set by attach)
    hosts: tuple[str, ...] = ()       # host name of each rank
    pids: tuple[int, ...] = ()        # process id of each rank (on its host)
    seq: int = 0                      # collectives entered so far on this rank
    call: Optional[_Call] = None      # the one in progress (collectives are serialised)
    owner: Optional[int] = None       # thread id that entered it (nested calls are not counted)
    answers: dict = dataclasses.field(default_factory=dict)  # rank -> status, from the query
    thread: Optional[threading.Thread] = None
    probes: list = dataclasses.field(default_factory=list)  # see add_probe
    probed: Optional[_Call] = None    # the latest wait a probe reported
    exit_hook: bool = False           # _stop_queries_at_exit is registered


_state = _State()
_guard = threading.Lock()
_comm_lock = threading.Lock()  # held while a status query uses _state.comm; detach waits for it
_closing = threading.Event()   # set by detach: a running query stops at once
_exiting = threading.Event()   # set at interpreter exit: no query runs any more


def attach(comm: Any) -> None:
    """Give the watchdog a duplicate of ``comm`` for status queries and learn each rank's host.

    Collective: every rank of ``comm`` must call this (:func:`hpcrep.comm.init` does).
    """
    from mpi4py import MPI  # noqa: PLC0415 - MPI is initialised by now

    _state.comm = comm.Dup()
    peers = comm.allgather((MPI.Get_processor_name(), os.getpid()))
    _state.hosts = tuple(host for host, _ in peers)
    _state.pids = tuple(pid for _, pid in peers)
    if not _state.exit_hook:
        # Registered after mpi4py's own exit-time MPI_Finalize, so it runs before it.
        atexit.register(_stop_queries_at_exit)
        _state.exit_hook = True


def _stop_queries_at_exit() -> None:
    """Stop a status query in progress and start no other, before MPI is finalized at exit: a
    query still probing then would make MPI abort the process (seen when a warning's query
    window was still open as a program ended)."""
    _exiting.set()
    _closing.set()
    with _comm_lock:
        pass


def hosts() -> tuple[str, ...]:
    """The host name of each rank of the job (empty before :func:`attach`). Local."""
    return _state.hosts


def pids() -> tuple[int, ...]:
    """The process id of each rank of the job, on its host (empty before :func:`attach`)."""
    return _state.pids


def detach(free: bool = True) -> None:
    """Free the status communicator (at :func:`hpcrep.comm.shutdown`). Collective, like attach.

    With ``free=False`` (the world was replaced after a failed rank) it is dropped instead of
    freed: it holds the dead rank. Local then.
    """
    _closing.set()
    try:
        with _comm_lock:  # a query still listening (its stall resolved) must not outlive it
            if _state.comm is not None:
                if free:
                    _state.comm.Free()
                _state.comm = None
    finally:
        _closing.clear()


def stall_timeout() -> float:
    """Return ``HPCREP_STALL_TIMEOUT`` in seconds (0 or less: the watchdog is off)."""
    return float(config.get("HPCREP_STALL_TIMEOUT"))


@contextlib.contextmanager
def watching(kind: str, names: Sequence[str]) -> Iterator[None]:
    """Record that this rank is in collective ``kind`` on ``names`` until the block ends.

    Nested use on the same thread (a grouped call inside another) keeps the outer record. Local.
    """
    timeout = stall_timeout()
    me = threading.get_ident()
    if timeout <= 0 or _state.owner == me:
        yield
        return
    _state.seq += 1
    _state.call = _Call(kind, tuple(names), _state.seq, time.monotonic(), timeout)
    _state.owner = me
    _ensure_thread()
    try:
        yield
    finally:
        _state.call = None
        _state.owner = None


def add_probe(probe: Callable[[], Optional[tuple[str, tuple[str, ...], float]]]) -> None:
    """Also watch waits that happen outside :func:`watching`: ``probe()`` returns ``(kind,
    names, started)`` (``started`` on ``time.monotonic``'s clock) while something waits for the
    other ranks, else None. For communication threads that call MPI themselves (the compiled
    TensorFlow path). Local.
    """
    _state.probes.append(probe)
    if stall_timeout() > 0:
        _ensure_thread()


def _probed_call() -> Optional[_Call]:
    """Return the oldest wait the probes report, keeping its warned flag across checks."""
    oldest = None
    for probe in _state.probes:
        found = probe()
        if found is not None and (oldest is None or found[2] < oldest[2]):
            oldest = found
    if oldest is None:
        _state.probed = None
        return None
    kind, names, started = oldest
    if _state.probed is None or _state.probed.started != started:
        _state.seq += 1
        _state.probed = _Call(kind, tuple(names), _state.seq, started, stall_timeout())
    return _state.probed


def _ensure_thread() -> None:
    if _state.thread is not None:
        return
    with _guard:
        if _state.thread is None:
            _state.thread = threading.Thread(target=_watch, name="hpcrep-stall-watchdog",
                                             daemon=True)
            _state.thread.start()


def _watch() -> None:
    """Daemon loop: warn at half the timeout, abort the job at the timeout."""
    while True:
        time.sleep(1.0)
        call = _state.call
        if call is None and _state.probes:
            call = _probed_call()
        if call is None:
            continue
        waited = time.monotonic() - call.started
        if waited >= call.timeout:
            _abort(call, waited)
        elif waited >= call.timeout / 2 and not call.warned:
            call.warned = True
            _say(f"warning: {_what(call)} has waited {waited:.0f} s for the other ranks; the job "
                 f"aborts at {call.timeout:.0f} s (HPCREP_STALL_TIMEOUT).")
            flight.dump(_rank(), "stall warning", _in_flight(call, waited))
            _state.answers = _query(call)


def _rank() -> int:
    return _state.comm.Get_rank() if _state.comm is not None else 0


def _what(call: _Call) -> str:
    shown = ", ".join(repr(n) for n in call.names[:3])
    more = f" and {len(call.names) - 3} more" if len(call.names) > 3 else ""
    return f"collective {call.kind} of {shown or 'no tensors'}{more} (call #{call.seq} here)"


def _say(text: str) -> None:
    host = _state.hosts[_rank()] if _state.hosts else "?"
    print(f"hpcrep: rank {_rank()} on {host}: {text}", file=sys.stderr, flush=True)


def _query(call: _Call) -> dict:
    """Tell every rank where this one waits; return the answers heard within the window.

    Ranks whose watchdog fired for the same stall send theirs at about the same time, so each
    side hears the other. They need not be in the same call: one rank may wait in a Python
    collective while another's communication thread (the compiled TensorFlow path) still waits
    in the previous one, so every status travels with one tag and names its own call; of what
    a rank sent, the newest is kept (an answer left over from an earlier warning that resolved
    may name an older call).
    """
    from mpi4py import MPI  # noqa: PLC0415

    with _comm_lock:
        if _exiting.is_set():
            return {}
        return _query_on(_state.comm, call, MPI)


def _query_on(comm: Any, call: _Call, mpi: Any) -> dict:
    """:func:`_query` on the watchdog's communicator ``comm`` (the caller holds the lock)."""
    if comm is None or mpi.Query_thread() != mpi.THREAD_MULTIPLE:
        return {}  # talking while the main thread is inside MPI needs MPI_THREAD_MULTIPLE
    me, n = comm.Get_rank(), comm.Get_size()
    status = (call.seq, call.kind, call.names[:1], flight.history())
    for r in range(n):
        if r != me:
            comm.isend(status, dest=r, tag=_STATUS_TAG)
    answers = {me: status}
    deadline = time.monotonic() + min(_ANSWER_WINDOW, call.timeout / 4)
    while time.monotonic() < deadline and len(answers) < n and not _closing.is_set():
        _take_answers(comm, answers, mpi)
        time.sleep(0.05)
    return answers


def _take_answers(comm: Any, answers: dict, mpi: Any) -> None:
    """Move every status message already arrived on ``comm`` into ``answers`` (newest wins)."""
    info = mpi.Status()
    while comm.iprobe(source=mpi.ANY_SOURCE, tag=_STATUS_TAG, status=info):
        sender = info.Get_source()
        value = comm.recv(source=sender, tag=_STATUS_TAG)
        if sender not in answers or value[0] >= answers[sender][0]:
            answers[sender] = value


def _late_answers() -> None:
    """Before the report: add answers that arrived after the query's window closed.

    Each rank's watchdog checks once a second from the moment that rank entered the collective,
    so a peer that entered later (a loaded machine) may send its status a second or more after
    this rank's window closed; it has still arrived at the collective and must not be reported
    as silent.
    """
    if not _state.answers:
        return  # no query ran (no MPI_THREAD_MULTIPLE, or no warning): nothing to add to
    from mpi4py import MPI  # noqa: PLC0415

    with _comm_lock:
        if _state.comm is not None and not _exiting.is_set():
            _take_answers(_state.comm, _state.answers, MPI)


def _report(call: _Call, waited: float) -> str:
    n = len(_state.hosts) or 1
    answers = _state.answers
    lines = [f"{_what(call)} has not completed after {waited:.0f} s "
             f"(HPCREP_STALL_TIMEOUT={call.timeout:g}). Aborting the whole job."]
    if answers:
        by_call: dict[tuple, list[int]] = {}
        for r, (seq, kind, *_) in sorted(answers.items()):
            by_call.setdefault((seq, kind), []).append(r)
        for (seq, kind), ranks in by_call.items():
            lines.append(f"  waiting in call #{seq} ({kind}): {_ranks(ranks)}")
        silent = [r for r in range(n) if r not in answers]
        if silent:
            lines.append(f"  no answer from {_ranks(silent)}: not arrived at "
                         "this collective (still computing, stuck outside hpcrep, dead) or "
                         "cannot be reached (a failed node or network link)")
    lines.append("  If a step legitimately takes this long, raise HPCREP_STALL_TIMEOUT "
                 "(0 turns the watchdog off).")
    return "\n".join(lines)


def _in_flight(call: _Call, waited: float) -> dict:
    """What this rank waits in, for the flight recorder's file."""
    return {"watchdog_call": call.seq, "kind": call.kind, "names": list(call.names[:8]),
            "waited_s": round(waited, 3)}


def _flight_summary(call: _Call, waited: float) -> str:
    """The flight recorder's lines of the report (writes this rank's file); '' when it is off."""
    path = flight.dump(_rank(), "stall abort", _in_flight(call, waited))
    if path is None:
        return ""
    histories = {r: value[3] for r, value in _state.answers.items() if len(value) > 3}
    histories[_rank()] = flight.history()
    lines = [f"  flight recorder: {flight.divergence_text(histories, _state.hosts)}; "
             "last collectives here:", *flight.last_lines(),
             f"  each waiting rank's last {flight.capacity()} collectives: "
             f"{path.replace(f'rank{_rank()}.json', 'rank<r>.json')}"]
    return "\n" + "\n".join(lines)


def _ranks(ranks: Sequence[int]) -> str:
    """Return 'ranks 0, 1 on node1; rank 2 on node2'."""
    hosts = _state.hosts
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(hosts[r] if r < len(hosts) else "?", []).append(r)
    return "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))} on {h}"
                     for h, rs in by_host.items())


def _abort(call: _Call, waited: float) -> None:
    """Print the report and end the job; never returns."""
    _late_answers()
    _say(_report(call, waited) + _flight_summary(call, waited))
    sys.stdout.flush()

    def mpi_abort() -> None:
        abort_job(EXIT_CODE)  # prints the notice that hpcrep's launchers watch for

    threading.Thread(target=mpi_abort, name="hpcrep-stall-abort", daemon=True).start()
    time.sleep(_ABORT_GRACE)
    os._exit(EXIT_CODE)
