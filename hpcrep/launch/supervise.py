"""Keep ``mpirun`` from outliving a job that a rank has aborted.

A rank that aborts the job (the stall watchdog after a cut link, an unhandled exception under
``python -m hpcrep``) prints :func:`hpcrep.comm.abort.abort_notice` on stderr, then calls
``MPI_Abort``. Open MPI 4.1's ``mpirun`` then orders every node's daemon to stop and waits until
each has answered. A daemon on a node it can no longer reach never answers, so ``mpirun`` stays
(on the test cluster: until the link came back), holding a batch allocation.

:func:`supervise` runs the launcher with its stderr relayed through this process, unchanged, as
it arrives. Once a notice has passed, the launcher has ``HPCREP_LAUNCHER_GRACE`` seconds to end
by itself; then it is asked to end as Ctrl-C would ask it (SIGTERM, up to three times a second
apart: Open MPI 4.1's ``mpirun`` exits at the third), and at last it and every process it had
started on this machine (ranks, launch agents such as ``ssh``, node daemons) are killed. The exit
code is then the notice's. Without a notice nothing changes: this returns the launcher's code.

stdin and stdout stay the launcher's own. SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to this
process are passed on to the launcher; so is SIGINT, unless it came from the terminal (the
launcher shares this process group, so the terminal's Ctrl-C reaches it directly). A Python
handler the caller had installed for one of them is called first (``hpcrep run --elastic``
notes there that the user asked the job to stop).

    python -m hpcrep.launch.supervise -- mpirun -n 4 python train.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Iterator, Mapping, Optional, Sequence

from hpcrep import config
from hpcrep.comm.abort import ABORT_NOTICE_PATTERN, DONE_NOTICE_PATTERN

_TERMS = 3             # SIGTERMs before SIGKILL (Open MPI 4.1 exits at the third)
_TERM_INTERVAL = 1.0   # seconds between them
_RELAY_DRAIN = 2.0     # seconds the relay may still copy stderr after the launcher has ended
_CARRY = 4096          # bytes of an unfinished line kept to find a notice split across reads
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


@dataclasses.dataclass
class _Notice:
    """The first abort notice seen in the launcher's stderr."""

    rank: int = -1
    code: int = 0
    done: bool = False               # the survivors' "job done" after a recovery, not an abort
    seen_at: Optional[float] = None  # time.monotonic() when it passed; None: not yet


def supervise(argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              grace: Optional[float] = None, err: Optional[IO] = None) -> int:
    """Run the launcher ``argv`` to its end, or end it ``grace`` seconds after an abort notice
    (or the notice of survivors that finished without lost ranks, :data:`DONE_NOTICE_PATTERN`).

    Args:
        argv: the launcher's command line (``mpirun ...``).
        env: its environment (default: this process's).
        grace: seconds the launcher may run on after the first abort notice in its stderr
            (default ``HPCREP_LAUNCHER_GRACE``; 0 or less: no supervision, as
            ``subprocess.call``).
        err: where its stderr goes (default ``sys.stderr``).

    Returns:
        The launcher's exit code (negative: the signal that ended it, as ``subprocess``); the
        notice's exit code where the launcher had to be ended.

    Local: runs on the host that starts the job, never on ranks.
    """
    grace = float(config.get("HPCREP_LAUNCHER_GRACE")) if grace is None else grace
    if grace <= 0:
        plain = subprocess.Popen(list(argv), env=env)
        with _passing_signals(plain.pid):
            return plain.wait()
    err = err if err is not None else sys.stderr
    proc = subprocess.Popen(list(argv), env=env, stderr=subprocess.PIPE)
    notice, lock = _Notice(), threading.Lock()
    relay = threading.Thread(target=_relay, args=(proc.stderr, err, notice, lock),
                             name="hpcrep-launcher-stderr", daemon=True)
    relay.start()
    with _passing_signals(proc.pid):
        code = _wait(proc, notice, grace, err, lock)
    relay.join(timeout=_RELAY_DRAIN)
    return code


def _wait(proc: subprocess.Popen, notice: _Notice, grace: float, err: IO,
          lock: threading.Lock) -> int:
    """Wait for the launcher; end it once ``grace`` has passed since a notice."""
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if notice.seen_at is not None and time.monotonic() - notice.seen_at >= grace:
            break
    what = ("the survivors of lost ranks finished the job" if notice.done
            else f"rank {notice.rank} aborted the job")
    with lock:
        _write(err, f"hpcrep: the launcher is still running {grace:g} s after {what} "
                    f"(HPCREP_LAUNCHER_GRACE): it waits for ranks or node daemons it cannot "
                    f"reach. Ending it and the processes it started on this host; exit code "
                    f"{notice.code}.\n".encode())
    started = _descendants(proc.pid)
    for _ in range(_TERMS):
        started.update(_descendants(proc.pid))
        _send(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=_TERM_INTERVAL)
            break
        except subprocess.TimeoutExpired:
            started.update(_descendants(proc.pid))
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid, start in started.items():
        if _start_time(pid) == start:  # the same process, not a new one with its number
            _send(pid, signal.SIGKILL)
    return notice.code


def _relay(stream: IO[bytes], err: IO, notice: _Notice, lock: threading.Lock) -> None:
    """Copy the launcher's stderr to ``err`` as it arrives; note the first abort notice."""
    fd, carry = stream.fileno(), b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        with lock:
            _write(err, chunk)
        if notice.seen_at is None:
            text = carry + chunk
            decoded = text.decode("utf-8", "replace")
            for pattern, done in ((ABORT_NOTICE_PATTERN, False), (DONE_NOTICE_PATTERN, True)):
                found = pattern.search(decoded)
                if found:
                    notice.rank, notice.code = int(found.group(1)), int(found.group(2))
                    notice.done, notice.seen_at = done, time.monotonic()
                    break
            carry = text[text.rfind(b"\n") + 1:][-_CARRY:]
    stream.close()


def _write(err: IO, data: bytes) -> None:
    """Write bytes to a binary or text stream and flush it."""
    try:
        buffer = getattr(err, "buffer", None)
        if buffer is not None:
            err.flush()
            buffer.write(data)
            buffer.flush()
        else:
            err.write(data.decode("utf-8", "replace"))
            err.flush()
    except (OSError, ValueError):  # a closed terminal or file: keep supervising regardless
        pass


@contextlib.contextmanager
def _passing_signals(pid: int) -> Iterator[None]:
    """Pass the signals of :data:`_FORWARDED` sent to this process on to ``pid``."""

    def forward(signum: int, frame: Any) -> None:
        previous = saved.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # a caller's own handler (run --elastic notes a stop)
        if signum == signal.SIGINT and _in_terminal_foreground():
            return  # the terminal sent it to the whole process group: the launcher has it
        _send(pid, signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the caller's own stay in force
        return
    saved: dict[int, Any] = {}
    for s in _FORWARDED:
        saved[s] = signal.signal(s, forward)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _in_terminal_foreground() -> bool:
    """Return True if this process group is the foreground group of a controlling terminal."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _start_time(pid: int) -> Optional[int]:
    """Return the start time of process ``pid`` (clock ticks after boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] != b"Z" else None


def _descendants(pid: int) -> dict[int, int]:
    """Return ``{pid: start time}`` of every living descendant of ``pid`` (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = int(fields[19])
    found: dict[int, int] = {}
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child in starts and child not in found:
            found[child] = starts[child]
            todo.extend(children.get(child, ()))
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hpcrep.launch.supervise [--] launcher args...``: run it supervised."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
