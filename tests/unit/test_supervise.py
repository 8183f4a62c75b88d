"""The launcher supervisor (hpcrep.launch.supervise) on stand-in launchers: small Python
processes that print what a rank's abort prints and then behave as mpirun does after a cut link
(stay, ignoring SIGTERM, with a child of their own), or end by themselves.

The real case, mpirun after a cut link on the test cluster, is tests/cluster/test_launcher_ends.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrep.comm.abort import ABORT_NOTICE_PATTERN, abort_notice, done_notice

ROOT = Path(__file__).resolve().parents[2]
GRACE = 1.0

# mpirun after a cut link: it has printed a rank's notice, ignores SIGTERM, and has a child (a
# launch agent, a daemon) that would outlive it.
STAYS = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "600"])
open(sys.argv[1], "w").write(str(child.pid))
print("rank output on stdout", flush=True)
sys.stderr.write("hpcrep: rank 2 on node1: collective allreduce ... Aborting the whole job.\\n")
sys.stderr.write("hpcrep: job abort: rank 2, exit code 75\\n")
sys.stderr.flush()
time.sleep(600)
"""


def supervised(code: str, *args: str, grace: float = GRACE, timeout: float = 60
               ) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``python -c CODE ARGS`` under ``python -m hpcrep.launch.supervise``; return it and
    how long it took."""
    env = {**os.environ, "HPCREP_LAUNCHER_GRACE": str(grace),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hpcrep.launch.supervise", "--",
                           sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)
    return done, time.monotonic() - start


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_notice_is_what_the_pattern_finds():
    found = ABORT_NOTICE_PATTERN.search(f"[1,3]<stderr>:{abort_notice(3, 75)}\n")
    assert found and (int(found.group(1)), int(found.group(2))) == (3, 75)


def test_a_launcher_that_stays_after_an_abort_is_ended_with_its_children(tmp_path):
    pidfile = tmp_path / "child"
    done, took = supervised(STAYS, str(pidfile))
    child = int(pidfile.read_text())
    try:
        assert done.returncode == 75, done.stderr
        # grace, then up to 3 SIGTERMs 1 s apart, then SIGKILL; plus two Python start-ups
        assert took < GRACE + 3 + 10, took
        assert "rank output on stdout" in done.stdout
        assert "hpcrep: job abort: rank 2, exit code 75" in done.stderr
        assert "still running 1 s after rank 2 aborted the job" in done.stderr, done.stderr
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the launcher's child outlived the supervisor"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_launcher_that_stays_after_the_survivors_finished_is_ended_with_status_0(tmp_path):
    """ULFM: survivors went on without a cut node and finished; mpirun waits for the node's
    daemon. Their rank 0's notice ends it as an abort notice would, with exit status 0."""
    pidfile = tmp_path / "child"
    stays = STAYS.replace("hpcrep: job abort: rank 2, exit code 75",
                          done_notice(0, "ranks 2, 3 of 4"))
    done, took = supervised(stays, str(pidfile))
    child = int(pidfile.read_text())
    try:
        assert done.returncode == 0, done.stderr
        assert took < GRACE + 3 + 10, took
        assert "after the survivors of lost ranks finished the job" in done.stderr, done.stderr
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_launcher_that_ends_within_the_grace_keeps_its_exit_code():
    code = ("import sys, time; sys.stderr.write('hpcrep: job abort: rank 0, exit code 75\\n'); "
            "sys.stderr.flush(); time.sleep(0.3); sys.exit(3)")
    done, _ = supervised(code, grace=30)
    assert done.returncode == 3, done.stderr
    assert "still running" not in done.stderr


def test_without_a_notice_nothing_is_ended_and_stderr_passes_unchanged():
    text = "line one\\nno newline at the end: Aborting the whole job."
    code = (f"import sys, time; sys.stderr.write('{text}'); sys.stderr.flush(); "
            "time.sleep(2 * " + str(GRACE) + "); sys.exit(4)")
    done, took = supervised(code)
    assert done.returncode == 4
    assert took >= 2 * GRACE
    assert done.stderr == text.replace("\\n", "\n")


def test_a_notice_split_across_writes_is_found():
    code = ("import sys, time; sys.stderr.write('hpcrep: job ab'); sys.stderr.flush(); "
            "time.sleep(0.3); sys.stderr.write('ort: rank 1, exit code 9\\n'); sys.stderr.flush(); "
            "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)")
    done, took = supervised(code)
    assert done.returncode == 9, done.stderr
    assert took < GRACE + 3 + 10


def test_sigterm_to_the_supervisor_reaches_the_launcher(tmp_path):
    got = tmp_path / "got"
    code = ("import signal, sys, time\n"
            "def on(s, f):\n"
            f"    open({str(got)!r}, 'w').write(str(s)); sys.exit(7)\n"
            "signal.signal(signal.SIGTERM, on)\n"
            f"open({str(got)!r} + '.ready', 'w').close()\n"
            "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hpcrep.launch.supervise", "--",
                             sys.executable, "-c", code], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{got}.ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "launcher did not start"
            time.sleep(0.05)
        time.sleep(0.2)  # the supervisor's handlers are set once the launcher runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7
        assert got.read_text() == str(int(signal.SIGTERM))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("argv", [[], ["--"]])
def test_no_command_is_a_usage_error(argv):
    done = subprocess.run([sys.executable, "-m", "hpcrep.launch.supervise", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "python -m hpcrep.launch.supervise" in done.stderr
