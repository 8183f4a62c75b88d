"""Shared pytest set-up: quiet TensorFlow, the repository's root (``repo``), and the rule for
tests whose requirements are absent.

A test that needs something this machine lacks (Slurm, root, a package) takes the
``skip_missing`` fixture and calls ``skip_missing("what")``, which skips with a reason that
starts with ``missing:``. Under ``CI=true`` such a skip is turned into a failure, because CI
installs everything the suite needs: a skip there means an install step is broken. Skips for
other reasons (e.g. "needs at least 2 ranks" at ``-n 1``) stay skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrep.launch.tf_log import set_tf_log_level

set_tf_log_level(os.environ)  # HPCREP_TF_LOG: quiet unless asked, before TensorFlow loads

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
