"""``HPCREP_CHECKPOINT_DIR`` under transparent mode, at 2 ranks, with real jobs.

Each ``fit`` of a script resumes only from its own checkpoints: a script that fits two different
models (``two_fits_job.py``) trains both on a fresh directory, and its rerun finds both finished,
says so, and returns each ``fit``'s History from the checkpoint. A rerun of a finished
``jobs/transparent_fit_numpy.py`` (which reads ``history.history['loss']``) exits 0 with the
first run's losses. One job per directory: a second job on a directory in use fails fast on every
rank naming the holder, and the first finishes unharmed; a job killed with SIGKILL leaves no
stale lock, and its rerun resumes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from hpcrep.launch.mpirun import mpirun_command

RANKS, E1, E2 = 2, 3, 2
FINISHED = ("fit {n} already finished its {e} epochs in the checkpoint of {d}: nothing to train; "
            "delete it or set HPCREP_CHECKPOINT_DIR elsewhere to train again")


def job(mpirun, *extra: str) -> list[str]:
    """The argv of ``two_fits_job.py`` under ``python -m hpcrep``."""
    return [sys.executable, "-m", "hpcrep", str(mpirun.root / "tests" / "launch" /
                                                "two_fits_job.py"),
            "--epochs1", str(E1), "--epochs2", str(E2), *extra]


def env(directory) -> dict:
    return {"HPCREP_CHECKPOINT_DIR": str(directory), "HPCREP_THREADS": "1"}


def histories(stdout: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{"fit1": (epochs, losses), ...}`` as the job printed them."""
    found = {}
    for name, epochs, losses in re.findall(r"^(fit\d) epochs=\[([\d, ]*)\] loss=([\d.,]*)$",
                                           stdout, re.M):
        found[name] = ([int(e) for e in epochs.split(",") if e.strip()],
                       [float(v) for v in losses.split(",") if v])
    return found


def epochs_done(progress) -> int:
    """The most epochs any rank has written to its ``PROGRESS.<rank>`` file so far."""
    done = [0]
    for path in progress.parent.glob(progress.name + ".*"):
        fields = path.read_text().split()
        done += [int(fields[1])] if len(fields) == 2 else []
    return max(done)


def output(proc) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.timeout(600)
def test_two_fits_train_their_own_epochs_and_a_rerun_returns_both_histories(mpirun, scratch):
    directory = scratch / "ckpt"
    first = mpirun.run(RANKS, job(mpirun), env=env(directory), timeout=300)
    assert first.returncode == 0, output(first)
    trained = histories(first.stdout)
    assert trained["fit1"][0] == list(range(E1)), output(first)
    assert trained["fit2"][0] == list(range(E2)), output(first)  # not 0 epochs, no crash
    assert trained["fit2"][1][-1] < trained["fit2"][1][0]  # the second model learns
    names = sorted(p.name for p in directory.glob("*.h5"))
    assert any(n.startswith("ckpt-fit1-") for n in names), names
    assert any(n.startswith("ckpt-fit2-") for n in names), names

    again = mpirun.run(RANKS, job(mpirun), env=env(directory), timeout=300)
    assert again.returncode == 0, output(again)
    said = again.stdout + again.stderr
    for n, e in ((1, E1), (2, E2)):
        assert said.count(FINISHED.format(n=n, e=e, d=directory)) == 1, said[-3000:]
    assert said.count("resumed from") == 2, said[-3000:]
    returned = histories(again.stdout)
    for name in ("fit1", "fit2"):
        assert returned[name][0] == trained[name][0], output(again)
        assert returned[name][1] == pytest.approx(trained[name][1], abs=2e-6)
    assert sorted(p.name for p in directory.glob("*.h5")) == names  # nothing saved or deleted


@pytest.mark.timeout(600)
def test_rerun_of_a_finished_job_returns_its_history_and_exits_0(mpirun, scratch):
    argv = [sys.executable, "-m", "hpcrep", str(mpirun.root / "jobs" / "transparent_fit_numpy.py"),
            "--rows", "512", "--epochs", "2", "--out", str(scratch / "out")]
    first = mpirun.run(RANKS, argv, env=env(scratch / "c"), timeout=300)
    assert first.returncode == 0, output(first)
    again = mpirun.run(RANKS, argv, env=env(scratch / "c"), timeout=300)
    assert again.returncode == 0, output(again)  # no KeyError: 'loss'
    assert FINISHED.format(n=1, e=2, d=scratch / "c") in again.stderr, output(again)
    loss = re.compile(r"^train loss \S+ -> \S+$", re.M)
    assert loss.findall(again.stdout) == loss.findall(first.stdout) != [], output(again)


@pytest.mark.timeout(600)
def test_a_second_job_on_a_directory_in_use_fails_fast_and_the_first_finishes(mpirun, scratch):
    directory, progress = scratch / "ckpt", scratch / "progress"
    holder = subprocess.Popen(
        mpirun_command(RANKS, job(mpirun, "--sleep", "5", "--progress", str(progress))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=mpirun.env(env(directory)))
    try:
        deadline = time.time() + 240
        while time.time() < deadline and holder.poll() is None and epochs_done(progress) < 1:
            time.sleep(0.2)
        assert holder.poll() is None, "the first job ended before the second could start"
        started = time.time()
        second = mpirun.run(RANKS, job(mpirun), env=env(directory), timeout=180)
        took, holder_running = time.time() - started, holder.poll() is None
        holder_out, holder_err = holder.communicate(timeout=300)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert second.returncode != 0, output(second)
    message = f"the checkpoint directory {directory} is in use by another job (host "
    assert message in second.stderr, second.stderr[-3000:]
    assert re.search(r"pid \d+; lock file ", second.stderr), second.stderr[-3000:]
    assert "CheckpointLockedError" in second.stderr and "rank 0: the checkpoint" in \
        second.stderr, second.stderr[-3000:]  # raised on both ranks, agreed
    assert "fit1 epochs" not in second.stdout  # it trained nothing
    assert took < 150 and holder_running  # it failed while the first job held the directory
    assert holder.returncode == 0, holder_out[-3000:] + holder_err[-3000:]
    trained = histories(holder_out)
    assert trained["fit1"][0] == list(range(E1)) and trained["fit2"][0] == list(range(E2))
    assert "resumed from" not in holder_err  # the second job left its files alone


@pytest.mark.timeout(600)
def test_a_killed_job_leaves_no_stale_lock_and_its_rerun_resumes(mpirun, scratch):
    directory, progress = scratch / "ckpt", scratch / "progress"
    mpirun.run_and_kill(RANKS, job(mpirun, "--sleep", "1.0", "--progress", str(progress)),
                        str(progress), victim=0, after=2, env=env(directory))  # rank 0: holder
    assert (directory / ".hpcrep-lock").exists()
    again = mpirun.run(RANKS, job(mpirun), env=env(directory), timeout=300)
    assert again.returncode == 0, output(again)
    assert "in use by another job" not in again.stderr
    assert "resumed from" in again.stderr, output(again)
    resumed = histories(again.stdout)
    assert 1 <= resumed["fit1"][0][0] and resumed["fit1"][0][-1] == E1 - 1, output(again)
    assert resumed["fit2"][0] == list(range(E2)), output(again)
