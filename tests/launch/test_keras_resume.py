"""Keras's own fault tolerance under hpcrep: kill -9 one rank of a 4-rank ``fit``, rerun the same
command, and the run resumes from the last backup and ends bitwise equal to an uninterrupted run
(model weights and every optimizer variable, compared dataset by dataset in the final weights
file). Covered: ``keras.callbacks.BackupAndRestore`` and ``ModelCheckpoint`` +
``model.load_weights`` under transparent mode, ``hvd.callbacks.BackupAndRestore`` with the
explicit API, and ``HPCREP_CHECKPOINT_DIR`` with ``fit``. The job is ``keras_resume_job.py``
(op determinism, fixed seeds, no shuffling)."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env
from transparent_helpers import PYTHON, REPO, run_ranks, scratch_dir

JOB = str(REPO / "tests" / "launch" / "keras_resume_job.py")
RANKS, EPOCHS, KILL_AFTER = 4, 8, 3


def job_argv(api: str, protect: str, directory, out, epochs: int = EPOCHS, *extra: str) -> list:
    runner = [PYTHON, "-m", "hpcrep"] if api == "transparent" else [PYTHON]
    return runner + [JOB, "--api", api, "--protect", protect, "--dir", str(directory),
                     "--out", str(out), "--epochs", str(epochs), *extra]


def weights_file(path) -> dict[str, np.ndarray]:
    """Every dataset of a Keras weights file (layers and optimizer), by name."""
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return found


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    assert any(k.startswith("optimizer/") for k in a), sorted(a)  # optimizer state compared too
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def epochs_logged(out) -> list[int]:
    with open(out / "log.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def digests(stderr: str) -> set[str]:
    """Every rank's final state digest (ranks share one pipe: lines may run together)."""
    return set(re.findall(r"weights-digest ([0-9a-f]{64})", stderr))


def progress(prefix: str, rank: int) -> tuple[int | None, int]:
    try:
        pid, epoch = open(f"{prefix}.{rank}").read().split()
        return int(pid), int(epoch)
    except (OSError, ValueError):
        return None, 0


def run_and_kill(argv: list, prefix: str, victim: int, after: int, timeout: float = 240,
                 env: dict | None = None) -> str:
    """Start ``argv`` on RANKS ranks; SIGKILL rank ``victim`` once it finished ``after`` epochs;
    fail if the job does not end by itself afterwards. Return its output."""
    env = mpirun_env({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                      **(env or {})})
    proc = subprocess.Popen(mpirun_command(RANKS, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    killed, deadline = False, time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        pid, epoch = progress(prefix, victim)
        if epoch >= after:
            os.kill(pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job hung after one rank was killed with SIGKILL")
    assert killed, f"rank {victim} never finished {after} epochs:\n{out[-3000:]}"
    assert proc.returncode != 0, out[-3000:]
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("api, protect, victim", [
    ("transparent", "backup", 2),
    ("transparent", "modelcheckpoint", 0),  # rank 0 is the one that writes
    ("explicit", "backup", 3),
])  # HPCREP_CHECKPOINT_DIR: rerun-and-resume in test_transparent_checkpoint.py; kill -9 and a
# bitwise resume from hpcrep checkpoints in test_kill_resume.py (and across nodes, tests/cluster)
def test_kill9_then_rerun_resumes_bitwise(api, protect, victim):
    with scratch_dir(f"kresume-{protect}") as root:
        env = {}
        if protect == "HPCREP_CHECKPOINT_DIR":
            protect, env = "none", {"HPCREP_CHECKPOINT_DIR": str(root / "dir")}
        ref = run_ranks(RANKS, job_argv(api, protect, root / "ref-dir", root / "ref"),
                        timeout=300)
        assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
        assert epochs_logged(root / "ref") == list(range(EPOCHS))

        argv = job_argv(api, protect, root / "dir", root / "out", EPOCHS,
                        "--sleep", "0.7", "--progress", str(root / "progress"))
        run_and_kill(argv, str(root / "progress"), victim, KILL_AFTER, env=env)
        assert not (root / "out" / "final.weights.h5").exists()

        again = run_ranks(RANKS, argv, timeout=300, env=env)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        resumed_from = epochs_logged(root / "out")[0]
        assert KILL_AFTER <= resumed_from < EPOCHS  # not from scratch, not past the end
        assert epochs_logged(root / "out") == list(range(resumed_from, EPOCHS))
        assert len(digests(again.stderr)) == 1, again.stderr[-2000:]  # ranks agree
        resumed = weights_file(root / "out" / "final.weights.h5")
        assert_bitwise_equal(resumed, weights_file(root / "ref" / "final.weights.h5"))
        print(f"{api}/{protect}: rank {victim} killed after {KILL_AFTER}+ epochs; the rerun "
              f"resumed at epoch {resumed_from} of {EPOCHS}; {len(resumed)} arrays bitwise equal")
