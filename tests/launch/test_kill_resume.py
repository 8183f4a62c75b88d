"""kill -9 one rank of a 4-rank training run: the job exits (no hang), the same command resumes
from the last checkpoint, and the final weights equal an uninterrupted run's bitwise (op
determinism on, fixed seeds, data a pure function of step and rank, MPI reductions in a fixed
order at a fixed world size)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "slurm", "examples", "train_resumable.py")
RANKS, STEPS, KILL_AT = 4, 30, 12


def command(tmp, name):
    d = os.path.join(tmp, name)
    return mpirun_command(RANKS, [sys.executable, SCRIPT, "--dir", d, "--steps", str(STEPS),
                                  "--save-every", "5", "--sleep", "0.3",
                                  "--progress", os.path.join(tmp, f"{name}-progress"),
                                  "--out", os.path.join(d, "final.npz")]), d


def run(argv, timeout=240):
    env = mpirun_env()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def read_progress(prefix, rank):
    try:
        pid, step = open(f"{prefix}.{rank}").read().split()
        return int(pid), int(step)
    except (OSError, ValueError):
        return None, 0


def final_weights(directory):
    with np.load(os.path.join(directory, "final.npz")) as z:
        return [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.timeout(900)
def test_kill9_one_rank_then_resume_matches_uninterrupted(tmp_path):
    tmp = str(tmp_path)
    ref_argv, ref_dir = command(tmp, "reference")
    done = run(ref_argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    argv, run_dir = command(tmp, "killed")
    env = mpirun_env()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    victim, deadline = None, time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        pid, step = read_progress(os.path.join(tmp, "killed-progress"), 2)
        if step >= KILL_AT:
            victim = pid
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    assert victim is not None, "rank 2 never reached the kill step:\n" + (proc.stdout.read()
                                                                            if proc.poll() else "")
    try:
        out, _ = proc.communicate(timeout=120)  # the job must end by itself, not hang
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job hung after one rank was killed with SIGKILL")
    assert proc.returncode != 0
    assert not os.path.exists(os.path.join(run_dir, "final.npz"))
    saved = sorted(int(n[5:14]) for n in os.listdir(run_dir) if n.startswith("ckpt-"))
    assert saved and saved[-1] < STEPS, saved

    again = run(argv)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"start_step={saved[-1]} resumed_from=ckpt-{saved[-1]:09d}.h5" in again.stdout
    resumed, reference = final_weights(run_dir), final_weights(ref_dir)
    assert len(resumed) == len(reference) == 4
    for a, b in zip(resumed, reference):
        np.testing.assert_array_equal(a, b)
