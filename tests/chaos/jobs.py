"""The jobs a chaos trial runs, one class per recovery mode: their command lines, the progress
they report, the weights they end with and the reference those must equal.

Every command names the trial's directory (``out``), which is how tests/chaos/procs.py finds
the trial's processes. Ranks run with ``HPCREP_THREADS=1``; ``tests/chaos/site`` comes first on
``PYTHONPATH`` so that a rank raises on SIGUSR2 (the ``raise`` fault).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from hpcrep.launch.mpirun import mpirun_env

from tests.chaos.schedule import Trial

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "site"
LAUNCH = ROOT / "tests" / "launch"
STALL_TIMEOUT = "6"  # seconds: the stall watchdog ends a job with a stopped rank


def base_env(**extra: str) -> dict:
    """The environment of a trial's launcher: unbuffered, one thread pool per rank, this
    checkout and the fault hook on ``PYTHONPATH``, what Open MPI needs as root, ``extra``."""
    path = os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCREP_THREADS": "1",
           "CHAOS_RAISE_ON_USR2": "1", "PYTHONPATH": path, **extra}
    env.pop("HPCREP_ELASTIC_DIR", None)
    env.update({k: v for k, v in extra.items() if k == "HPCREP_ELASTIC_DIR"})
    return mpirun_env(env)


def load_npz(path: Path, prefix: str = "") -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` file ``path``, keys prefixed with ``prefix``."""
    with np.load(path) as z:
        return {prefix + k: z[k] for k in z.files}


def read_text(path: Path) -> str:
    """``path``'s text, or "" if it is not there."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class Job:
    """What every mode's job provides to tests/chaos/runner.py."""

    bound = 300.0       # seconds one launch may take before it counts as a hang
    reruns = 2          # launches after the first when one fails (the user runs it again)
    abort_ok = False    # whether ending without a result is an acceptable outcome of a fault

    def __init__(self, trial: Trial, out: Path) -> None:
        self.trial, self.out = trial, out
        self.out.mkdir(parents=True, exist_ok=True)

    # launching -----------------------------------------------------------------------------
    def command(self, attempt: int) -> tuple[list[str], dict, Path]:
        """argv, environment and working directory of launch ``attempt`` (0 first)."""
        raise NotImplementedError

    def reference_command(self, out: Path) -> list[tuple[list[str], dict, Path]]:
        """The launches that build the reference in ``out`` (one after the other)."""
        raise NotImplementedError

    # watching -------------------------------------------------------------------------------
    def observe(self) -> None:
        """Called about every 50 ms while a launch runs: note what the job's files show."""

    def progress(self) -> int:
        """Units of work done so far (steps, or epochs), as the job reports them."""
        raise NotImplementedError

    def recovering(self, attempt: int, since: float) -> bool:
        """True once the job recovers from a fault injected at ``since`` (wall clock)."""
        raise NotImplementedError

    def write_dir(self) -> Path:
        """Where the job's commits or checkpoints are written (their temporaries appear)."""
        return self.out

    # results --------------------------------------------------------------------------------
    def weights(self) -> list[dict[str, np.ndarray]]:
        """The final state of every rank that wrote one ([] if none did)."""
        raise NotImplementedError

    def reference_key(self) -> Optional[str]:
        """What identifies the reference this trial's weights must equal (None: cannot tell)."""
        raise NotImplementedError

    def reference_weights(self, out: Path) -> dict[str, np.ndarray]:
        """Read the reference built in ``out``."""
        raise NotImplementedError

    def recovery_seconds(self, fault_time: float) -> Optional[float]:
        """Seconds from the fault at ``fault_time`` to the first step (or, in ``relaunch``,
        epoch) the job completed after recovering from it."""
        return None

    def ledger(self) -> Optional[dict]:
        """Rows (or epochs) lost and trained twice in what the model kept, where the job keeps a
        ledger: ``{"lost": n, "duplicated": n}``; None where it keeps none."""
        return None

    def readable(self) -> Optional[str]:
        """After a kill during a write: None if the newest complete checkpoint or commit reads
        back, else what is wrong."""
        return None


def _run_check(code: str, *args: str) -> Optional[str]:
    """Run ``code`` in a fresh Python of .venv (so that this process never loads MPI); None if
    it succeeds, else its error's last line."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]


class ResumeJob(Job):
    """slurm/examples/train_resumable.py on 2 ranks under ``python -m hpcrep.launch.mpirun``: a
    fault aborts it; the same command again resumes from its newest good HDF5 checkpoint. The
    reference is the uninterrupted run (bitwise: weights and optimizer state)."""

    bound = 240.0
    FLAGS = {"sgd": [], "mixed": ["--mixed-precision", "--initial-scale", "256",
                                  "--growth-steps", "3"],
             "powersgd": ["--powersgd", "2", "--warmup", "3"]}
    STEPS = 20

    def __init__(self, trial: Trial, out: Path) -> None:
        super().__init__(trial, out)
        self._first_seen: dict[int, float] = {}  # pid of a rank: when its first step was seen

    def _argv(self, out: Path, sleep: float) -> list[str]:
        return [sys.executable, "-m", "hpcrep.launch.mpirun", "-n", str(self.trial.ranks), "--",
                sys.executable, str(ROOT / "slurm" / "examples" / "train_resumable.py"),
                "--dir", str(out / "ckpt"), "--steps", str(self.STEPS), "--save-every", "5",
                "--sleep", str(sleep), "--progress", str(out / "progress"),
                "--out", str(out / "final.npz"), "--out-optimizer",
                str(out / "final-optimizer.npz"), *self.FLAGS[self.trial.features]]

    def command(self, attempt: int) -> tuple[list[str], dict, Path]:
        env = base_env(HPCREP_STALL_TIMEOUT=STALL_TIMEOUT)
        return self._argv(self.out, 0.15), env, ROOT

    def reference_command(self, out: Path) -> list[tuple[list[str], dict, Path]]:
        return [(self._argv(out, 0.0), base_env(), ROOT)]

    def _steps(self) -> list[tuple[int, int]]:
        found = []
        for path in glob.glob(str(self.out / "progress.*")):
            parts = read_text(Path(path)).split()
            if len(parts) == 2:
                found.append((int(parts[0]), int(parts[1])))
        return found

    def progress(self) -> int:
        return max((step for _, step in self._steps()), default=0)

    def recovering(self, attempt: int, since: float) -> bool:
        return attempt >= 1

    def write_dir(self) -> Path:
        return self.out / "ckpt"

    def weights(self) -> list[dict[str, np.ndarray]]:
        if not (self.out / "final.npz").exists():
            return []
        return [{**load_npz(self.out / "final.npz", "model/"),
                 **load_npz(self.out / "final-optimizer.npz", "optimizer/")}]

    def reference_key(self) -> Optional[str]:
        return f"resume-{self.trial.features}-{self.trial.ranks}"

    def reference_weights(self, out: Path) -> dict[str, np.ndarray]:
        return {**load_npz(out / "final.npz", "model/"),
                **load_npz(out / "final-optimizer.npz", "optimizer/")}

    def observe(self) -> None:
        now = time.time()
        for pid, _ in self._steps():
            self._first_seen.setdefault(pid, now)

    def recovery_seconds(self, fault_time: float) -> Optional[float]:
        after = [t for t in self._first_seen.values() if t > fault_time]
        return min(after) - fault_time if after else None

    def readable(self) -> Optional[str]:
        files = sorted(glob.glob(str(self.write_dir() / "ckpt-*.h5")))
        if not files:
            return None
        return _run_check("import sys; from hpcrep.checkpoint import read_verified; "
                          "read_verified(sys.argv[1])", files[-1])


class RelaunchJob(Job):
    """tests/launch/elastic_job.py on 2 ranks under ``hpcrep run --elastic`` (Open MPI 4,
    .venv): a fault ends the job and ``hpcrep run`` relaunches it from its last commit. Five
    epochs of 4 steps, a commit after each; the reference is the same launch never failing."""

    bound = 300.0
    EPOCHS = 5

    def _argv(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "hpcrep.cli", "run", "-np", str(self.trial.ranks),
                "--elastic", str(LAUNCH / "elastic_job.py"), "--epochs", str(self.EPOCHS),
                "--epoch-sleep", "0.3", "--out", str(out / "final.npz")]

    def command(self, attempt: int) -> tuple[list[str], dict, Path]:
        # the relaunch path: with .venv-ulfm built, hpcrep run --elastic would recover in place
        return self._argv(self.out), base_env(HPCREP_STALL_TIMEOUT=STALL_TIMEOUT,
                                              HPCREP_ELASTIC_RECOVERY="relaunch"), self.out

    def reference_command(self, out: Path) -> list[tuple[list[str], dict, Path]]:
        return [(self._argv(out), base_env(HPCREP_ELASTIC_RECOVERY="relaunch"), out)]

    def _stdout(self) -> str:
        return read_text(self.out / "stdout-0.txt") + read_text(self.out / "stdout-1.txt") + \
            read_text(self.out / "stdout-2.txt")

    def progress(self) -> int:
        return len(re.findall(r"rank 0 finished epoch \d+", self._stdout()))

    def recovering(self, attempt: int, since: float) -> bool:
        starts = [float(t) for t in re.findall(r"rank 0 starts at epoch \d+ at ([0-9.]+)",
                                               self._stdout())]
        return attempt >= 1 or any(t > since for t in starts)

    def weights(self) -> list[dict[str, np.ndarray]]:
        path = self.out / "final.npz"
        return [load_npz(path)] if path.exists() else []

    def reference_key(self) -> Optional[str]:
        return f"relaunch-{self.trial.features}-{self.trial.ranks}"

    def reference_weights(self, out: Path) -> dict[str, np.ndarray]:
        return load_npz(out / "final.npz")

    def recovery_seconds(self, fault_time: float) -> Optional[float]:
        text = self._stdout()
        starts = [float(t) for t in re.findall(r"rank 0 starts at epoch \d+ at ([0-9.]+)", text)]
        after = [t for t in starts if t > fault_time]
        if not after:
            return None
        ends = [float(t) for t in re.findall(r"rank 0 finished epoch \d+ at ([0-9.]+)", text)]
        ends = [t for t in ends if t > after[0]]
        return min(ends) - fault_time if ends else None

    def ledger(self) -> Optional[dict]:
        """Epochs finished (each after its commit) must be 0..EPOCHS-1, each once."""
        done = [int(e) for e in re.findall(r"rank 0 finished epoch (\d+)", self._stdout())]
        return {"lost": len(set(range(self.EPOCHS)) - set(done)),
                "duplicated": len(done) - len(set(done)), "unit": "epochs"}
