"""``hpcrep doctor`` on real set-ups of this machine: ``.venv`` (Debian Open MPI 4.1, no ULFM),
``.venv-ulfm`` (Open MPI 5 with ULFM), and one broken set-up per check where one can be made:
an mpirun of another MPI first on PATH, the compiled op's library made unloadable in a copy of
the package, more ranks than cores; and ``hpcrep run --check`` for a job's placement. Each
doctor run loads TensorFlow once in a child and starts one 2-rank allreduce job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from hpcrep.comm.yield_policy import usable_cores


def doctor(python: str, *argv: str, env: Optional[dict] = None, cwd=None,
           command: str = "doctor") -> tuple[int, dict, str]:
    """Run ``python -m hpcrep.cli doctor --json ARGV``; return (exit code, the JSON document's
    checks by name, all output). ``command="run"`` runs ``hpcrep run --check`` (no JSON)."""
    root = Path(__file__).resolve().parents[2]
    run_env = {**os.environ, "HPCREP_THREADS": "1", **(env or {})}
    run_env.setdefault("PYTHONPATH", str(root))
    extra = ["--json"] if command == "doctor" else ["--check"]
    try:
        done = subprocess.run([python, "-m", "hpcrep.cli", command, *extra, *argv],
                              capture_output=True, text=True, timeout=300, env=run_env,
                              cwd=cwd or root)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hpcrep {command} did not end within 300 s: {exc.stdout}\n{exc.stderr}")
    output = done.stdout + done.stderr
    if command != "doctor":
        return done.returncode, {}, output
    start = done.stdout.find("{")
    assert start >= 0, output
    checks = {c["name"]: c for c in json.loads(done.stdout[start:])["checks"]}
    return done.returncode, checks, output


def assert_allreduce_ran(check: dict) -> None:
    """The 2-rank job ran and measured; on a machine others load it may only warn."""
    assert check["status"] in ("ok", "warn"), check
    assert "8-byte allreduce" in check["finding"] and "GB/s" in check["finding"], check


@pytest.mark.timeout(400)
def test_venv_is_ready_without_ulfm(repo):
    code, checks, out = doctor(sys.executable)
    assert code == 0, out
    assert checks["mpi-library"]["status"] == "ok", out
    assert "Open MPI 4.1" in checks["mpi-library"]["finding"]
    assert checks["compiled-op"]["status"] == "ok", out
    assert "openmpi4" in checks["compiled-op"]["finding"]
    ulfm = checks["ulfm"]
    assert ulfm["status"] == "ok" and "has no ULFM" in ulfm["finding"], ulfm
    if (repo / ".venv-ulfm" / "bin" / "python").exists():  # hpcrep run --elastic uses it
        assert ".venv-ulfm" in ulfm["finding"] and "in-process recovery" in ulfm["finding"]
    else:
        assert "relaunches the job from its last commit" in ulfm["finding"], ulfm
    assert checks["cores"]["status"] == "ok"
    assert_allreduce_ran(checks["allreduce"])


@pytest.mark.timeout(400)
def test_ulfm_venv_has_ulfm(ulfm_venv):
    code, checks, out = doctor(str(ulfm_venv / "bin" / "python"))
    assert code == 0, out
    assert "Open MPI 5.0" in checks["mpi-library"]["finding"], out
    assert checks["mpi-library"]["status"] == "ok"
    assert checks["ulfm"]["status"] == "ok" and "has ULFM" in checks["ulfm"]["finding"]
    assert "openmpi5" in checks["compiled-op"]["finding"], out
    assert_allreduce_ran(checks["allreduce"])


@pytest.mark.timeout(400)
def test_mpirun_of_another_mpi_first_on_path_fails(ulfm_venv):
    path = f"{ulfm_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    code, checks, out = doctor(sys.executable, env={"PATH": path})
    assert code == 1, out
    found = checks["mpi-library"]
    assert found["status"] == "fail", found
    assert "mpi4py loads Open MPI 4.1" in found["finding"] and "is Open MPI 5.0" in \
        found["finding"], found
    assert "first on PATH" in found["fix"]
    assert checks["allreduce"]["status"] == "skip"


@pytest.fixture
def broken_op_package(scratch, repo) -> Path:
    """A copy of the hpcrep package whose compiled op for Debian's Open MPI is not a library."""
    shutil.copytree(repo / "hpcrep", scratch / "hpcrep",
                    ignore=shutil.ignore_patterns("__pycache__"))
    so = scratch / "hpcrep" / "tensorflow" / "native" / "_hpcrep_ops.openmpi4.so"
    if not so.exists():
        pytest.skip("missing: the compiled op for Open MPI 4 (make install)")
    so.write_bytes(b"not a shared library")
    return scratch


@pytest.mark.timeout(600)
def test_unloadable_compiled_op_warns_and_fails_when_required(broken_op_package):
    env = {"PYTHONPATH": str(broken_op_package)}
    code, checks, out = doctor(sys.executable, env=env, cwd=broken_op_package)
    found = checks["compiled-op"]
    assert code == 0, out
    assert found["status"] == "warn", found
    assert "slower Python path" in found["finding"] and "failed to load" in found["finding"]
    assert str(broken_op_package) in found["finding"], found
    assert "hpcrep.tensorflow.native.build" in found["fix"]
    code, checks, out = doctor(sys.executable, env={**env, "HPCREP_NATIVE": "on"},
                               cwd=broken_op_package)
    assert code == 1, out
    assert checks["compiled-op"]["status"] == "fail", checks["compiled-op"]


@pytest.mark.timeout(400)
def test_run_check_warns_of_more_ranks_than_cores(scratch):
    ranks = 4 * usable_cores()
    script = scratch / "train.py"
    script.write_text("raise SystemExit('hpcrep run --check must not run the script')\n")
    code, _, out = doctor(sys.executable, "-np", str(ranks), str(script), command="run")
    assert code == 0, out
    assert f"warn cores: {ranks} ranks on a node of {usable_cores()} cores" in out, out
    assert "must not run the script" not in out
    assert "hpcrep doctor:" in out.splitlines()[-1]
