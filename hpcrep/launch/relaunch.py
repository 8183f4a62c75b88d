"""``hpcrep run --elastic`` on an MPI without ULFM: relaunch a failed job from its last commit.

Without ULFM a lost rank ends the whole job (:mod:`hpcrep.launch.supervise` makes sure the
launcher ends too). With ``--elastic`` the job is then started again, on the hosts the launcher
can still reach, and resumes from the last ``state.commit()`` of its ``hvd.elastic`` state
objects, which rank 0 writes to ``HPCREP_ELASTIC_DIR`` (:mod:`hpcrep.tensorflow.elastic`): set
by the user, or a new directory under the working directory for this ``hpcrep run``, removed
when the job succeeds.

SIGTERM, SIGINT or SIGHUP sent to ``hpcrep run`` (a user's Ctrl-C or ``kill``, a batch system
ending the job) stop it: the signal goes on to the running launcher, and the job is not
relaunched however it then ends; the last commit stays for a later run to resume from.

A relaunch happens only when the failed attempt made progress (a commit newer than the one it
started from): a script that fails before its first commit, or fails again before committing
anything new, is not restarted (it would fail the same way), nor after ``--reset-limit``
relaunches, nor when fewer than ``--min-np`` ranks fit on the reachable hosts. The rank count
is the first attempt's, or all the slots of the hosts still reachable if fewer; a host counts
as reachable when the launcher can start ``true`` on it within :data:`PROBE_TIMEOUT` seconds,
with the same launcher options as the job.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from hpcrep.comm import hosts_back
from hpcrep.launch.hosts import Host

PROBE_TIMEOUT = 20.0  # seconds the launcher may take to run `true` on a host
COMMIT_GLOB = "elastic-state-*.npz"  # what hvd.elastic's commit() writes (elastic/state.py)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One launch of the job and how it ended."""

    number: int          # 1 for the first launch
    returncode: int
    seconds: float
    progressed: bool     # a commit newer than the one it started from was written


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do after an attempt: relaunch on ``hosts`` with ``ranks`` ranks, or stop."""

    relaunch: bool
    reason: str
    ranks: int = 0
    hosts: tuple[Host, ...] = ()


def last_commit(directory: str) -> int:
    """Return the newest modification time (ns) of the commits in ``directory``, 0 if none."""
    times = [os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(directory, COMMIT_GLOB))]
    return max(times, default=0)


def decide(attempt: Attempt, requested: int, reset_limit: int, min_np: int,
           reachable: Optional[Sequence[Host]]) -> Decision:
    """Return whether and where to relaunch after ``attempt`` failed. Pure.

    ``requested``: the first attempt's rank count; ``reachable``: the hosts that answered the
    probe (None for local ranks, which are always there).
    """
    if attempt.returncode == 0:
        return Decision(False, "the job succeeded")
    relaunches = attempt.number - 1
    if relaunches >= reset_limit:
        return Decision(False, f"it has been relaunched {relaunches} time(s) already "
                               f"(--reset-limit {reset_limit})")
    if not attempt.progressed:
        return Decision(False, "it committed nothing new before failing (no state.commit() "
                               "reached HPCREP_ELASTIC_DIR since it started), so a relaunch "
                               "would fail the same way")
    if reachable is None:
        return Decision(True, "local ranks", requested, ())
    slots = sum(h.slots for h in reachable)
    ranks = min(requested, slots)
    if ranks < min_np:
        names = ", ".join(h.name for h in reachable) or "none"
        return Decision(False, f"only {slots} slot(s) on the hosts still reachable ({names}), "
                               f"fewer than --min-np {min_np}")
    return Decision(True, "hosts still reachable", ranks, tuple(reachable))


def decide_growth(attempt: Attempt, max_np: int, requested: int,
                  reachable: Optional[Sequence[Host]]) -> Decision:
    """Return where to relaunch a job that stopped at a commit to grow back onto a host it had
    lost (:mod:`hpcrep.comm.hosts_back`): every reachable host, up to ``max_np`` ranks (or
    ``requested``, the first attempt's count, if larger). Pure."""
    if not attempt.progressed:
        return Decision(False, "it asked to grow but wrote no commit to resume from")
    most = max(max_np, requested)
    if reachable is None:
        return Decision(True, "local ranks", most, ())
    slots = sum(h.slots for h in reachable)
    if slots == 0:
        return Decision(False, "no host answers the probe")
    return Decision(True, "hosts reachable again", min(most, slots), tuple(reachable))


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Note SIGTERM, SIGINT and SIGHUP received by this process in the list yielded (a caller's
    own Python handlers still run). While a launcher runs under
    :func:`hpcrep.launch.supervise.supervise` these handlers are called by its own, which pass
    the signal on to the launcher. Local; the main thread only (elsewhere nothing is noted)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def note(signum: int, frame: Any) -> None:
        received.append(signum)
        previous = saved.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)

    saved: dict[int, Any] = {}
    for signum in _STOP_SIGNALS:
        saved[signum] = signal.signal(signum, note)
    try:
        yield received
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def probe_hosts(hosts: Sequence[Host], probe_argv: Callable[[Host], list[str]],
                env: dict, timeout: float = PROBE_TIMEOUT) -> list[Host]:
    """Return the hosts on which ``probe_argv(host)`` (the launcher running ``true`` there)
    exits 0 within ``timeout`` seconds, in their order. Probes run in parallel."""
    def answers(host: Host) -> bool:
        proc = subprocess.Popen(probe_argv(host), env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout) == 0
        except subprocess.TimeoutExpired:  # the launcher and what it started (ssh, a daemon)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        ok = list(pool.map(answers, hosts))
    return [h for h, good in zip(hosts, ok) if good]


def run_elastic(launch: Callable[[int, Sequence[Host], dict], int], ranks: int,
                hosts: Sequence[Host], env: dict, reset_limit: int, min_np: int,
                probe_argv: Optional[Callable[[Host], list[str]]] = None,
                log: Callable[[str], None] = lambda line: print(line, file=sys.stderr,
                                                                flush=True),
                max_np: int = 0) -> int:
    """Run ``launch(ranks, hosts, env)`` (the launcher's exit code) and relaunch it after a
    failure as :func:`decide` says; return the last attempt's exit code. A job that stopped to
    grow back onto a host it had lost (:mod:`hpcrep.comm.hosts_back`, ULFM with ``max_np``) is
    relaunched on every one of ``hosts`` that answers, as :func:`decide_growth` says; that does
    not count against ``reset_limit``. Stopped by a signal (:func:`stop_requests`) before the
    job succeeded: no relaunch, and 128 + the signal's number is returned.

    ``env`` gets ``HPCREP_ELASTIC_DIR`` (a new directory under the working directory unless it
    is set; that one is removed after a success). ``hosts`` empty: local ranks, never probed.
    """
    created = None
    if not env.get("HPCREP_ELASTIC_DIR"):
        created = tempfile.mkdtemp(prefix=".hpcrep-elastic-", dir=os.getcwd())
        env = {**env, "HPCREP_ELASTIC_DIR": created}
    directory = env["HPCREP_ELASTIC_DIR"]
    log(f"hpcrep run: elastic: commits go to {directory}; a failed job is relaunched from its "
        f"last commit (at most {reset_limit} time(s))")
    with stop_requests() as stops:
        code = _attempts(launch, ranks, hosts, env, directory, reset_limit, min_np, probe_argv,
                         log, max_np, stops)
    if stops and code != 0:
        name = signal.Signals(stops[0]).name
        log(f"hpcrep run: elastic: stopped by {name} (the job ended with exit {code}); not "
            f"relaunching. Its last commit stays in {directory}: run the same command with "
            f"HPCREP_ELASTIC_DIR={directory} to resume from it")
        return 128 + stops[0]
    if code == 0 and created is not None:
        shutil.rmtree(created, ignore_errors=True)
    return code


def _attempts(launch: Callable[[int, Sequence[Host], dict], int], ranks: int,
              hosts: Sequence[Host], env: dict, directory: str, reset_limit: int, min_np: int,
              probe_argv: Optional[Callable[[Host], list[str]]], log: Callable[[str], None],
              max_np: int, stops: list[int]) -> int:
    """Launch, and relaunch as :func:`run_elastic` says, until the job succeeds, a relaunch is
    refused or ``stops`` holds a signal; return the last attempt's exit code."""
    number, current_ranks, current_hosts = 1, ranks, tuple(hosts)
    while True:
        before = last_commit(directory)
        start = time.monotonic()
        code = launch(current_ranks, current_hosts, env)
        if stops:
            return code
        attempt = Attempt(number, code, time.monotonic() - start,
                          last_commit(directory) > before)
        if hosts_back.relaunch_requested(directory) is not None:
            hosts_back.clear(directory)
            reachable = (probe_hosts(hosts, probe_argv, env)
                         if hosts and probe_argv is not None else None)
            growth = decide_growth(attempt, max_np, ranks, reachable)
            if growth.relaunch:
                where = (", ".join(f"{h.name}:{h.slots}" for h in growth.hosts)
                         if growth.hosts else "this machine")
                log(f"hpcrep run: elastic: the job stopped at a commit to grow back after "
                    f"{attempt.seconds:.1f} s; relaunching {growth.ranks} rank(s) on {where} "
                    "from that commit")
                current_ranks, current_hosts = growth.ranks, growth.hosts
                continue
            log(f"hpcrep run: elastic: the job stopped to grow back but is not relaunched: "
                f"{growth.reason}")
        if code == 0:
            return 0
        reachable = None
        if current_hosts and probe_argv is not None:
            probed = time.monotonic()
            reachable = probe_hosts(current_hosts, probe_argv, env)
            lost = [h.name for h in current_hosts if h not in reachable]
            log(f"hpcrep run: elastic: probed {len(current_hosts)} host(s) in "
                f"{time.monotonic() - probed:.1f} s"
                + (f"; no longer reachable: {', '.join(lost)}" if lost else ""))
        decision = decide(attempt, ranks, reset_limit, min_np, reachable)
        if not decision.relaunch:
            log(f"hpcrep run: elastic: the job failed (exit {code}) after "
                f"{attempt.seconds:.1f} s; not relaunching: {decision.reason}. Its last commit "
                f"stays in {directory}: run the same command with HPCREP_ELASTIC_DIR={directory} "
                "to resume from it")
            return code
        if stops:  # asked to stop while the hosts were probed
            return code
        where = (", ".join(f"{h.name}:{h.slots}" for h in decision.hosts) if decision.hosts
                 else "this machine")
        log(f"hpcrep run: elastic: the job failed (exit {code}) after {attempt.seconds:.1f} s; "
            f"relaunching {decision.ranks} rank(s) on {where} from the last commit "
            f"(relaunch {number} of at most {reset_limit})")
        number, current_ranks, current_hosts = number + 1, decision.ranks, decision.hosts
