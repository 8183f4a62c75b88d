"""The compiled allreduce op built for Open MPI 5 (``make ulfm`` builds
``_hpcrep_ops.openmpi5.so`` beside .venv's ``_hpcrep_ops.openmpi4.so``) is the one a job under
``.venv-ulfm``'s mpirun loads, and the compiled-path tests pass with it at 2 ranks (each MPI
runs the op built against it). Skipped (a failure under CI=true) without
``.venv-ulfm``."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env


@pytest.mark.timeout(300)
def test_the_compiled_op_built_for_open_mpi_5_loads_and_passes_its_tests(ulfm_venv, repo):
    python = str(ulfm_venv / "bin" / "python")
    env = mpirun_env({**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
                      "HPCREP_THREADS": "1",
                      "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])})
    status = subprocess.run([python, "-m", "hpcrep.tensorflow.native"], capture_output=True,
                            text=True, timeout=120, env=env, cwd=repo)
    assert "_hpcrep_ops.openmpi5.so) is active" in status.stdout, status.stdout + status.stderr
    argv = mpirun_command(2, [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/mpi/test_native.py"], mpirun=str(ulfm_venv / "bin" / "mpirun"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=repo)
    out = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0, out
    summaries = re.findall(r"(\d+) passed(.*) in [\d.]+s", done.stdout)
    assert len(summaries) >= 1 and all("skipped" not in rest for _, rest in summaries), out
