"""Shared pytest set-up: quiet TensorFlow, the repository's root (``repo``), the rule for
tests whose requirements are absent, and what the ``hpcrep run`` jobs of tests/launch must
produce (``explicit_step_ok``, ``transparent_run_ok``: tests/launch and tests/cluster run them).

A test that needs something this machine lacks (Slurm, root, a package) takes the
``skip_missing`` fixture and calls ``skip_missing("what")``, which skips with a reason that
starts with ``missing:``. Under ``CI=true`` such a skip is turned into a failure, because CI
installs everything the suite needs: a skip there means an install step is broken. Skips for
other reasons (e.g. "needs at least 2 ranks" at ``-n 1``) stay skips.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

import pytest

from hpcrep.launch.tf_log import set_tf_log_level

set_tf_log_level(os.environ)  # HPCREP_TF_LOG: quiet unless asked, before TensorFlow loads
# The flight recorder writes a file per rank when a job fails (hpcrep/comm/flight.py), in the
# working directory by default; the suite fails jobs on purpose, so its files go to a directory
# of this process's own (inherited by the jobs it starts). Tests that read them set their own.
if "HPCREP_FLIGHT_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["HPCREP_FLIGHT_DIR"] = tempfile.mkdtemp(prefix="hpcrep-flight-")
    atexit.register(shutil.rmtree, os.environ["HPCREP_FLIGHT_DIR"], ignore_errors=True)

MISSING = "missing:"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository's root directory (``jobs/``, ``slurm/``, ``tests/`` are below it)."""
    return ROOT


def in_ci() -> bool:
    """Return True when running under CI (``CI=true``), where nothing may be missing."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(name="skip_missing", scope="session")
def skip_missing_fixture():
    """Return ``skip(what)``: skip the test because ``what`` is absent (a failure under CI=true)."""

    def skip(what: str) -> None:
        pytest.skip(f"{MISSING} {what}")

    return skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci()):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if MISSING in reason:
        report.outcome = "failed"
        report.longrepr = f"CI=true: a required component is absent, so this skip fails: {reason}"


def _explicit_step_ok(out: Path, ranks: int) -> None:
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


def _transparent_run_ok(done, ranks: int) -> None:
    """What run_plain_job.py printed: transparent mode on, every rank's weights bit for bit the
    same (a digest each, on stderr), the loss fell."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"hpcrep transparent mode: {ranks} rank(s)" in done.stdout + done.stderr, \
        done.stderr[-3000:]
    digests = re.findall(r"weights-digest ([0-9a-f]{64})", done.stderr)
    assert len(digests) == ranks and len(set(digests)) == 1, digests
    first, last = map(float, re.findall(r"train loss ([\d.]+) -> ([\d.]+)", done.stdout)[0])
    assert last < 0.5 * first, done.stdout[-2000:]


@pytest.fixture(scope="session")
def explicit_step_ok():
    """``explicit_step_ok(OUT, RANKS)``: check what tests/launch/explicit_step.py wrote."""
    return _explicit_step_ok


@pytest.fixture(scope="session")
def transparent_run_ok():
    """``transparent_run_ok(DONE, RANKS)``: check a finished ``hpcrep run`` of
    tests/launch/run_plain_job.py."""
    return _transparent_run_ok
