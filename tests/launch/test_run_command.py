"""``hpcrep run -np 2 -H localhost:2`` end to end: an explicit-API script runs as it is (its
gradients averaged once: one SGD step equals the closed form on the whole batch), an unchanged
Keras script runs in transparent mode, and an unchanged Horovod script runs on hpcrep's modules
through the ``horovod`` alias."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def check_explicit_step(out: Path, ranks: int) -> None:
    """What explicit_step.py wrote: one step equals the closed form on every rank, the weights
    are equal bit for bit across ranks, and the loss falls."""
    results = [np.load(out / f"rank{r}.npz") for r in range(ranks)]
    assert int(results[0]["size"]) == ranks
    layers = sum(1 for k in results[0].files if k.startswith("w0_"))
    for r, res in enumerate(results):
        for i in range(layers):
            step = np.abs(res[f"w1_{i}"] - res[f"w0_{i}"]).max()
            assert step > 1e-3, f"rank {r}: layer {i} did not move"
            np.testing.assert_allclose(res[f"w1_{i}"], res[f"expected_{i}"], rtol=1e-5,
                                       atol=1e-6, err_msg=f"rank {r} weights {i}: one step is "
                                       "not the step of the whole batch")
            for key in (f"w0_{i}", f"w1_{i}", f"final_{i}"):
                np.testing.assert_array_equal(res[key], results[0][key],
                                              err_msg=f"{key} differs on rank {r}")
        losses = res["losses"]
        assert losses[-1] < 0.5 * losses[0], f"rank {r}: loss did not fall: {losses}"


@pytest.mark.timeout(300)
def test_explicit_api_script_runs_as_it_is(mpirun, scratch):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2", "--verbose",
                      str(HERE / "run_explicit_job.py"), str(scratch))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "imports hpcrep.tensorflow.keras (line 4): explicit API" in done.stderr, done.stderr
    assert re.search(r"--host localhost:2 \S+ -m hpcrep --no-transparent ", done.stderr)
    assert TRANSPARENT_LINE not in done.stdout + done.stderr
    check_explicit_step(scratch, 2)


@pytest.mark.timeout(300)
def test_unchanged_horovod_script_runs_on_hpcrep(mpirun, scratch):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2",
                      str(HERE / "run_horovod_job.py"), str(scratch))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stderr.count(ALIAS_LINE) == 1, done.stderr[-3000:]  # rank 0 only
    assert TRANSPARENT_LINE not in done.stdout + done.stderr
    check_explicit_step(scratch, 2)


def check_transparent_run(done, ranks: int) -> None:
    """What run_plain_job.py printed: transparent mode on, every rank's weights bit for bit the
    same (a digest each, on stderr), the loss fell."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"hpcrep transparent mode: {ranks} rank(s)" in done.stdout + done.stderr, \
        done.stderr[-3000:]
    digests = re.findall(r"weights-digest ([0-9a-f]{64})", done.stderr)
    assert len(digests) == ranks and len(set(digests)) == 1, digests
    first, last = map(float, re.findall(r"train loss ([\d.]+) -> ([\d.]+)", done.stdout)[0])
    assert last < 0.5 * first, done.stdout[-2000:]


@pytest.mark.timeout(300)
def test_unchanged_keras_script_runs_transparently(mpirun):
    done = hpcrep_run(mpirun, "-np", "2", "-H", "localhost:2", "--verbose",
                      str(HERE / "run_plain_job.py"))
    assert "imports none of hpcrep.tensorflow, hpcrep.keras, horovod: transparent mode" in \
        done.stderr, done.stderr[-3000:]
    check_transparent_run(done, 2)
