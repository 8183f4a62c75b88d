"""A killed rank on the second node ends the job, and the rerun resumes from the last checkpoint,
as on one node. A cut network link (the stall watchdog, then the launcher) is
tests/cluster/test_launcher_ends.py."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

TRAIN = "slurm/examples/train_resumable.py"


def train(directory: Path, steps: int, progress: bool = True, sleep: float = 0.0) -> list[str]:
    """The argv of the resumable training job, checkpointing into ``directory``, sleeping
    ``sleep`` s per step (pacing, so that a kill lands mid-run)."""
    argv = [sys.executable, TRAIN, "--dir", str(directory / "ckpt"), "--steps", str(steps),
            "--save-every", "5", "--sleep", str(sleep), "--out", str(directory / "final.npz")]
    if progress:
        directory.mkdir(parents=True, exist_ok=True)
        argv += ["--progress", str(directory / "progress")]
    return argv


def progress(directory: Path, rank: int) -> tuple[int, int]:
    """(pid, steps done) that rank ``rank`` last wrote, or (0, 0)."""
    try:
        pid, step = (directory / f"progress.{rank}").read_text().split()
        return int(pid), int(step)
    except (OSError, ValueError):
        return 0, 0


def wait_for_step(proc, directory: Path, step: int, timeout: float = 180) -> list[int]:
    """Wait until every rank has done ``step`` steps; return the four ranks' pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [progress(directory, r) for r in range(4)]
        if all(s >= step for _, s in done):
            return [pid for pid, _ in done]
        if proc.poll() is not None:
            pytest.fail(f"the job ended before step {step}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"the ranks did not reach step {step} in {timeout} s")


@pytest.mark.timeout(600)
def test_kill9_on_node2_ends_the_job_and_the_rerun_resumes(cluster, tmp_path):
    steps, kill_at = 30, 12
    ref, run = tmp_path / "reference", tmp_path / "killed"
    done = cluster.mpirun(["-n", "4"], train(ref, steps, progress=False), timeout=240)
    assert done.returncode == 0, done.stdout[-4000:]

    proc = cluster.popen(["-n", "4"], train(run, steps, sleep=0.2))
    pids = wait_for_step(proc, run, kill_at)
    os.kill(pids[2], signal.SIGKILL)  # rank 2 runs on node2
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job hung after rank 2 on node2 was killed with SIGKILL")
    assert proc.returncode != 0
    assert not (run / "final.npz").exists()
    saved = sorted(int(p.name[5:14]) for p in (run / "ckpt").glob("ckpt-*.h5"))
    assert saved and saved[-1] < steps, saved

    again = cluster.mpirun(["-n", "4"], train(run, steps), timeout=240)
    assert again.returncode == 0, again.stdout[-4000:]
    assert f"start_step={saved[-1]} resumed_from=ckpt-{saved[-1]:09d}.h5" in again.stdout
    with np.load(run / "final.npz") as a, np.load(ref / "final.npz") as b:
        assert len(a.files) == len(b.files) == 4
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
