"""``hpcrep run --elastic`` without ULFM: a rank SIGKILLed mid-run ends the job, ``hpcrep run``
relaunches it from the last ``hvd.elastic`` commit (one ``hpcrep run``, exit 0) and it ends with
the weights of a run that never failed; a stopped (hung) rank is caught by the stall watchdog and
the job relaunched the same way; a job that fails before committing anything is not relaunched;
SIGTERM or SIGINT sent to ``hpcrep run`` stops the job for good (no relaunch). These are the
relaunch path's tests (HPCREP_ELASTIC_RECOVERY=relaunch); with the project's .venv-ulfm built,
the default ``hpcrep run --elastic`` recovers in place instead, as the last test shows."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

JOB = str(Path(__file__).with_name("elastic_job.py"))
TRANSPARENT_JOB = str(Path(__file__).with_name("transparent_elastic_job.py"))


def hpcrep_run(mpirun, cwd, *argv: str, timeout: float = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``hpcrep run ARGV`` from ``cwd`` (where --elastic makes its commit directory)."""
    env = mpirun.env({"HPCREP_THREADS": "1", "HPCREP_ELASTIC_RECOVERY": "relaunch",
                      "PYTHONPATH": os.pathsep.join([str(mpirun.root),
                                                     os.environ.get("PYTHONPATH", "")]),
                      **(env or {})})
    env.pop("HPCREP_ELASTIC_DIR", None)
    try:
        return subprocess.run([sys.executable, "-m", "hpcrep.cli", "run", *argv],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hpcrep run did not end within {timeout} s: {argv}\n{exc.stderr}")


@pytest.mark.timeout(600)
def test_a_killed_rank_is_relaunched_from_the_last_commit_by_one_hpcrep_run(mpirun, scratch):
    marker, out = os.path.join(scratch, "killed-once"), os.path.join(scratch, "relaunched.npz")
    run = hpcrep_run(mpirun, scratch, "-np", "2", "--elastic", JOB, "--fail-at", "3",
                     "--kill-once", marker, "--out", out)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert os.path.exists(marker)  # rank 1 did die
    assert "relaunching 2 rank(s) on this machine from the last commit" in run.stderr, run.stderr
    starts = re.findall(r"rank 0 starts at epoch (\d+)", run.stdout)
    assert starts == ["0", "3"], run.stdout  # two attempts, the second from the commit of epoch 3
    finished = [int(e) for e in re.findall(r"rank 0 finished epoch (\d+)", run.stdout)]
    assert finished == [0, 1, 2, 3, 4], run.stdout  # every epoch trained once in what was kept
    assert not glob.glob(os.path.join(scratch, ".hpcrep-elastic-*"))  # removed after success
    kill = float(Path(marker).read_text())
    first = float(re.search(r"rank 0 finished epoch 3 at ([0-9.]+)", run.stdout).group(1))
    print(f"failure to the first resumed epoch's end: {first - kill:.1f} s")

    clean_out = os.path.join(scratch, "clean.npz")  # launched the same way, never failing
    clean = hpcrep_run(mpirun, scratch, "-np", "2", "--elastic", JOB, "--out", clean_out)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "relaunching" not in clean.stderr
    a, b = np.load(out), np.load(clean_out)
    assert len(a.files) == 4
    for key in a.files:  # weights, and (through the commit) SGD momentum, carried over
        np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("batches_per_commit", [0, 4], ids=["epoch-commits", "batch-commits"])
def test_an_unchanged_keras_script_is_relaunched_from_its_last_commit(mpirun, scratch,
                                                                      batches_per_commit):
    """Transparent mode without ULFM: ``hpcrep run --elastic`` makes ``fit`` commit each epoch
    (and with ``--batches-per-commit 4`` every 4 batches) to its directory; rank 1
    SIGKILLed before batch 10 of epoch 2 ends the job, which is relaunched and resumes at epoch 2
    (from the commit of epoch 1, or after batch 8 of epoch 2: its first 8 x 2 x 32 rows): exit
    0, one History of the 3 epochs, equal weights."""
    every = ["--batches-per-commit", str(batches_per_commit)] if batches_per_commit else []
    run = hpcrep_run(mpirun, scratch, "-np", "2", "--elastic", *every, TRANSPARENT_JOB,
                     str(scratch), env={"KILL_RANK": "1", "KILL_AT": "10"})
    output = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode == 0, output
    assert os.path.exists(os.path.join(scratch, "death")), output  # rank 1 did die
    every = "every 4 batches of array input and " if batches_per_commit else ""
    assert f"fit commits {every}at every epoch's end to HPCREP_ELASTIC_DIR" in run.stderr, output
    assert "relaunching 2 rank(s) on this machine from the last commit" in run.stderr, output
    where = "after row 512 of epoch 2" if batches_per_commit else "at the end of epoch 1"
    assert f"hpcrep: fit resumes on 2 ranks from the commit {where} " in run.stderr, output
    lines = [line for line in run.stdout.splitlines() if line.startswith("epochs logged")]
    assert len(lines) == 1 and lines[0].startswith("epochs logged 3; test accuracy"), output
    weights = [np.load(os.path.join(scratch, f"weights{r}.npz")) for r in (0, 1)]
    for key in weights[0].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    assert not glob.glob(os.path.join(scratch, ".hpcrep-elastic-*"))


@pytest.mark.timeout(300)
def test_a_stopped_rank_is_caught_by_the_watchdog_and_the_job_relaunched(mpirun, scratch):
    """A hung rank (SIGSTOP) never fails by itself: the others' stall watchdog aborts the job
    HPCREP_STALL_TIMEOUT seconds later, every rank goes (the stopped one too), and --elastic
    relaunches it from the last commit."""
    marker, out = os.path.join(scratch, "stopped-once"), os.path.join(scratch, "after-stop.npz")
    run = hpcrep_run(mpirun, scratch, "-np", "2", "--elastic", JOB, "--fail-at", "3",
                     "--kill-once", marker, "--stop-once", "--out", out,
                     env={"HPCREP_STALL_TIMEOUT": "5"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "has not completed after" in run.stderr, run.stderr[-3000:]  # the watchdog's report
    assert re.findall(r"rank 0 starts at epoch (\d+)", run.stdout) == ["0", "3"], run.stdout
    stop = float(Path(marker).read_text())
    first = float(re.search(r"rank 0 finished epoch 3 at ([0-9.]+)", run.stdout).group(1))
    print(f"stop to the first resumed epoch's end: {first - stop:.1f} s (stall timeout 5 s)")
    assert os.path.exists(out)


@pytest.mark.timeout(300)
def test_a_job_that_fails_before_committing_is_not_relaunched(mpirun, scratch):
    run = hpcrep_run(mpirun, scratch, "-np", "2", "--elastic", "--reset-limit", "5", JOB,
                     "--fail-at", "0", "--out", os.path.join(scratch, "never.npz"))
    assert run.returncode != 0
    assert "not relaunching: it committed nothing new" in run.stderr, run.stderr[-3000:]
    assert run.stdout.count("rank 0 starts at epoch 0") == 1, run.stdout
    kept = glob.glob(os.path.join(scratch, ".hpcrep-elastic-*"))
    assert len(kept) == 1 and f"HPCREP_ELASTIC_DIR={kept[0]}" in run.stderr


def _job_processes(marker: str) -> list[str]:
    """Return the command lines of living processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker.encode() in cmdline and state != "Z":
                found.append(cmdline.decode(errors="replace"))
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, recovery", [(signal.SIGTERM, "relaunch"),
                                              (signal.SIGINT, "relaunch"),
                                              (signal.SIGTERM, "auto")],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-in-place"])
def test_a_signal_to_hpcrep_run_stops_an_elastic_job_without_a_relaunch(mpirun, scratch, signum,
                                                                        recovery):
    """``kill`` (or Ctrl-C from a script) stops ``hpcrep run --elastic``: the launcher and its
    ranks end within seconds, there is no relaunch, the exit code is 128 + the signal, and the
    last commit is kept with the command that resumes from it."""
    out = os.path.join(scratch, "stopped.npz")
    env = mpirun.env({"HPCREP_THREADS": "1", "HPCREP_ELASTIC_RECOVERY": recovery,
                      "PYTHONPATH": os.pathsep.join([str(mpirun.root),
                                                     os.environ.get("PYTHONPATH", "")])})
    env.pop("HPCREP_ELASTIC_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "hpcrep.cli", "run", "-np", "2", "--elastic",
                             JOB, "--epochs", "200", "--epoch-sleep", "0.5", "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=scratch, start_new_session=True)
    try:
        for line in proc.stdout:  # the job is running and has committed
            if line.startswith("rank 0 finished epoch 1 "):
                break
        else:
            pytest.fail(f"the job ended before its second commit: {proc.stderr.read()[-3000:]}")
        sent = time.monotonic()
        proc.send_signal(signum)
        try:
            rest, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"hpcrep run went on for 60 s after {signum.name}")
        ended = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"{signum.name} to hpcrep run's exit: {ended:.1f} s")
    assert proc.returncode == 128 + signum, err[-3000:]
    assert f"stopped by {signum.name}" in err and "not relaunching" in err, err[-3000:]
    assert "relaunching 2 rank(s)" not in err, err[-3000:]
    assert "rank 0 starts at epoch" not in rest, rest  # no second attempt
    assert not os.path.exists(out)  # the job did not run to its end
    kept = glob.glob(os.path.join(scratch, ".hpcrep-elastic-*"))
    assert len(kept) == 1 and os.listdir(kept[0]), err[-3000:]  # the last commit stays
    assert f"HPCREP_ELASTIC_DIR={kept[0]}" in err
    deadline = time.monotonic() + 10  # no rank outlives the launcher for long
    while _job_processes(out) and time.monotonic() < deadline:  # this job's (its own --out)
        time.sleep(0.2)
    assert not _job_processes(out), _job_processes(out)
