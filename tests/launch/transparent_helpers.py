"""Helpers for the transparent-mode launch tests: run a command on N ranks, with a timeout."""

from __future__ import annotations

import os
import subprocess
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
