"""Tests that start MPI jobs themselves: how they run them, and what they read back.

Tests reach these through fixtures (a conftest is not imported): ``mpirun`` runs a command on N
local ranks (``mpirun.run``), a ``jobs/`` script (``mpirun.run_job``), or kills one rank mid-run
(``mpirun.run_and_kill``); ``scratch`` is a temporary directory of the test's own;
``ulfm_venv`` is ``.venv-ulfm`` (Open MPI 5 with ULFM);
``epochs_logged`` and ``weights_file`` read what a Keras job wrote; ``keras_job`` builds the
command line of ``keras_resume_job.py``. Job scripts (``probe.py``, ``keras_resume_job.py``, ...)
sit beside the tests and are run, never imported.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import h5py
import numpy as np
import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env

HERE = Path(__file__).resolve().parent


class LocalMPI:
    """Runs MPI jobs on this machine; a job that outlives its timeout fails the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = sys.executable

    def env(self, extra: Optional[dict] = None) -> dict:
        """The environment of a job: this one, TensorFlow's log level as ``HPCREP_TF_LOG`` asks
        (quiet by default), unbuffered output, ``extra``."""
        return mpirun_env({**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})})

    def run(self, n: int, command: Sequence[str], timeout: float = 240,
            env: Optional[dict] = None, cwd=None) -> subprocess.CompletedProcess:
        """Run ``command`` on ``n`` local ranks and return it (stdout and stderr apart)."""
        try:
            return subprocess.run(mpirun_command(n, list(command)), capture_output=True,
                                  text=True, timeout=timeout, cwd=cwd, env=self.env(env))
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"MPI job did not finish within {timeout} s: {list(command)}\n"
                        f"stdout: {exc.stdout}\nstderr: {exc.stderr}")

    def run_job(self, n: int, script: str, *args: object, timeout: float = 400,
                env: Optional[dict] = None) -> subprocess.CompletedProcess:
        """Run ``jobs/SCRIPT ARGS`` on ``n`` ranks from the repository's root."""
        return self.run(n, [self.python, str(self.root / "jobs" / script), *map(str, args)],
                        timeout=timeout, env=env, cwd=self.root)

    def run_and_kill(self, n: int, command: Sequence[str], progress: str, victim: int,
                     after: int, timeout: float = 240, env: Optional[dict] = None) -> str:
        """Start ``command`` on ``n`` ranks; SIGKILL rank ``victim`` once it has done ``after``
        units of work; fail unless the job then ends by itself, with an error. Return its output.

        The job's ranks write ``<pid> <units done>`` to ``PROGRESS.<rank>`` as they go
        (``keras_resume_job.py --progress``, ``slurm/examples/train_resumable.py --progress``).
        """
        proc = subprocess.Popen(mpirun_command(n, list(command)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env(env),
                                cwd=self.root, start_new_session=True)
        killed, deadline = False, time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            pid, done = _progress(f"{progress}.{victim}")
            if done >= after:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"the job hung after rank {victim} was killed with SIGKILL:\n"
                        f"{out[-3000:]}")
        assert killed, f"rank {victim} never did {after} units of work:\n{out[-3000:]}"
        assert proc.returncode != 0, out[-3000:]
        return out

    @staticmethod
    @contextlib.contextmanager
    def scratch(prefix: str) -> Iterator[Path]:
        """A temporary directory of our own, removed afterwards.

        Not pytest's ``tmp_path``: its roots are pruned by any other pytest session of the same
        user (only the newest 3 are kept), which on a machine shared by several developers can
        delete a directory while an MPI job writes into it."""
        path = tempfile.mkdtemp(prefix=f"hpcrep-{prefix}-")
        try:
            yield Path(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _progress(path: str) -> tuple[Optional[int], int]:
    try:
        with open(path) as f:
            pid, done = f.read().split()
        return int(pid), int(done)
    except (OSError, ValueError):
        return None, 0


class KerasJob:
    """``keras_resume_job.py``: its command line and what it prints."""

    script = str(HERE / "keras_resume_job.py")

    def argv(self, api: str, protect: str, directory, out, epochs: int, *extra: str) -> list:
        """The job's argv: under ``python -m hpcrep`` for ``api="transparent"``."""
        runner = [sys.executable, "-m", "hpcrep"] if api == "transparent" else [sys.executable]
        return runner + [self.script, "--api", api, "--protect", protect, "--dir",
                         str(directory), "--out", str(out), "--epochs", str(epochs), *extra]

    @staticmethod
    def digests(stderr: str) -> set[str]:
        """Every rank's final state digest (ranks share one pipe: lines may run together)."""
        return set(re.findall(r"weights-digest ([0-9a-f]{64})", stderr))


@pytest.fixture(scope="session")
def mpirun(repo) -> LocalMPI:
    """Runs MPI jobs on local ranks (see :class:`LocalMPI`)."""
    return LocalMPI(repo)


@pytest.fixture(scope="session")
def finished_jobs() -> Iterator[tuple[contextlib.ExitStack, dict]]:
    """Jobs that module-scoped fixtures have run, for their later set-ups in this session: an
    ExitStack that keeps their scratch directories until the session ends, and a dict the
    fixture keys as it likes. Under pytest-xdist a worker can set a module's parametrized job
    fixture up again for a param it already ran (seen in the gate: each transparent job twice);
    with this the job itself runs once."""
    with contextlib.ExitStack() as stack:
        yield stack, {}


@pytest.fixture
def scratch(request) -> Iterator[Path]:
    """A temporary directory of this test's own (see :meth:`LocalMPI.scratch`)."""
    with LocalMPI.scratch(re.sub(r"\W+", "-", request.node.name)[:40]) as path:
        yield path


@pytest.fixture(scope="session")
def ulfm_venv(skip_missing, repo) -> Path:
    """The Open MPI 5 / ULFM environment of this checkout, ``.venv-ulfm`` (``make ulfm``; skips,
    or fails under CI, without it)."""
    venv = Path(repo) / ".venv-ulfm"
    if not (venv / "bin" / "python").exists() or not (venv / "bin" / "mpirun").exists():
        skip_missing(f"the Open MPI 5 / ULFM environment {venv} (make it with: make ulfm)")
    return venv


@pytest.fixture(scope="session")
def keras_job() -> KerasJob:
    """The command line and output of ``keras_resume_job.py``."""
    return KerasJob()


def _epochs_logged(out) -> list[int]:
    with open(Path(out) / "log.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def _weights_file(path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return found


@pytest.fixture(scope="session")
def epochs_logged():
    """``epochs_logged(OUT)``: the epochs a job's ``CSVLogger`` wrote to ``OUT/log.csv``."""
    return _epochs_logged


@pytest.fixture(scope="session")
def weights_file():
    """``weights_file(PATH)``: every dataset of a Keras weights file (layers and optimizer)."""
    return _weights_file
