"""Helpers for the transparent-mode launch tests: run a command on N ranks, with a timeout."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env

REPO = Path(__file__).resolve().parents[2]


def run_ranks(n: int, command: list[str], timeout: float = 240, cwd=None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` on ``n`` local ranks; fail the test (not hang) after ``timeout`` s."""
    full_env = mpirun_env({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
                           **(env or {})})
    try:
        return subprocess.run(mpirun_command(n, command), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=full_env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"MPI job did not finish within {timeout} s: {command}\n"
                    f"stdout: {exc.stdout}\nstderr: {exc.stderr}")

PYTHON = sys.executable


@contextlib.contextmanager
def scratch_dir(prefix: str):
    """A temporary directory of our own: pytest's ``tmp_path`` roots are pruned by any other
    pytest session of the same user (only the newest 3 are kept), which on a machine shared by
    several developers can delete a directory while our MPI job writes into it."""
    path = tempfile.mkdtemp(prefix=f"hpcrep-{prefix}-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
