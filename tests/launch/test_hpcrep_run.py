"""``hpcrep run -np 2 -H localhost:2`` end to end: an explicit-API script runs as it is (its
gradients averaged once: one SGD step equals the closed form on the whole batch), an unchanged
Keras script runs in transparent mode, and an unchanged Horovod script runs on hpcrep's modules
through the ``horovod`` alias."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TRANSPARENT_LINE = "hpcrep transparent mode:"
ALIAS_LINE = "hpcrep: Horovod is not installed"


def hpcrep_run(mpirun, *argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``hpcrep run ARGV`` from the repository's root; fail the test past ``timeout``."""
    env = mpirun.env({"HPCREP_THREADS": "1",
                      "PYTHONPATH": os.pathsep.join([str(mpirun.root),
                                                     os.environ.get("PYTHONPATH", "")])})
    try:
        return subprocess.run([sys.executable, "-m", "hpcrep.cli", "run", *argv],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=mpirun.root)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hpcrep run did not end within {timeout} s: {argv}\n{exc.stderr}")


@pytest.mark.timeout(300)
def test_explicit_api_script_runs_as_it_is(mpirun, scratch, explicit_step_ok):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2", "--verbose",
                      str(HERE / "run_explicit_job.py"), str(scratch))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "imports hpcrep.tensorflow.keras (line 4): explicit API" in done.stderr, done.stderr
    assert re.search(r"--host localhost:2 \S+ -m hpcrep --no-transparent ", done.stderr)
    assert TRANSPARENT_LINE not in done.stdout + done.stderr
    explicit_step_ok(scratch, 2)


@pytest.mark.timeout(300)
def test_unchanged_horovod_script_runs_on_hpcrep(mpirun, scratch, explicit_step_ok):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2",
                      str(HERE / "run_horovod_job.py"), str(scratch))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stderr.count(ALIAS_LINE) == 1, done.stderr[-3000:]  # rank 0 only
    assert TRANSPARENT_LINE not in done.stdout + done.stderr
    explicit_step_ok(scratch, 2)


@pytest.mark.timeout(300)
def test_unchanged_keras_script_runs_transparently(mpirun, transparent_run_ok):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2", "--verbose",
                      str(HERE / "run_plain_job.py"))
    assert "imports none of hpcrep.tensorflow, hpcrep.keras, horovod: transparent mode" in \
        done.stderr, done.stderr[-3000:]
    transparent_run_ok(done, 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_yield_when_the_slots_given_outnumber_the_cores(mpirun, ranks):
    """``-H localhost:4`` on a 2-core machine: Open MPI takes the slots as given and would keep
    waiting ranks spinning; every rank sets mpi_yield_when_idle before MPI starts when its node
    holds more ranks than cores, and leaves it unset otherwise."""
    from hpcrep.comm.yield_policy import usable_cores

    done = hpcrep_run(mpirun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--no-transparent",
                      str(HERE / "yield_probe.py"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("yield "))
    seen = json.loads(line[len("yield "):])
    assert seen["local_size"] == ranks
    expected = "1" if ranks > usable_cores() else None
    assert seen["values"] == [expected] * ranks, (usable_cores(), seen)
