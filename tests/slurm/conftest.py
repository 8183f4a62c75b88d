"""The Slurm cluster of tests/cluster (one node or more): find it, or skip (fail under CI=true).

``make test-cluster`` starts the cluster (``tests/cluster/up.sh --nodes 2``), runs these tests
among others, and removes it. They run on one node and pass on a one-node cluster too
(``tests/cluster/up.sh --nodes 1``). Clients find it through ``SLURM_CONF`` (default:
/tmp/hpcrep-cluster/slurm.conf).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

CONF = os.environ.get("SLURM_CONF", "/tmp/hpcrep-cluster/slurm.conf")


def _unavailable() -> str:
    if not shutil.which("sbatch"):
        return "Slurm is not installed (run tests/cluster/up.sh as root, or make test-cluster)"
    if not os.path.exists(CONF):
        return f"no test cluster: {CONF} is missing (run tests/cluster/up.sh as root)"
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True,
                          env={**os.environ, "SLURM_CONF": CONF}, timeout=30)
    if done.returncode != 0 or "idle" not in done.stdout and "mix" not in done.stdout:
        return f"the test cluster does not answer: {done.stderr.strip() or done.stdout.strip()}"
    return ""


@pytest.fixture(scope="session")
def slurm_env(skip_missing) -> dict:
    """Environment for Slurm clients talking to the test cluster (skips, or fails under CI)."""
    reason = _unavailable()
    if reason:
        skip_missing(reason)
    env = dict(os.environ)
    env["SLURM_CONF"] = CONF
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def job_info(job_id: str, env: dict) -> dict:
    """Return ``scontrol show job`` fields of ``job_id`` (empty once Slurm forgot the job)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, env=env, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout)) if done.returncode == 0 else {}


def _cluster_logs(lines: int = 15) -> str:
    """The tails of the test cluster's controller and job-completion logs, for failure reports."""
    log_dir = os.path.join(os.path.dirname(CONF), "log")
    parts = []
    for name in ("slurmctld.log", "jobcomp.log"):
        try:
            with open(os.path.join(log_dir, name)) as f:
                parts.append(f"--- {name} (last {lines} lines)\n" + "".join(f.readlines()[-lines:]))
        except OSError as exc:
            parts.append(f"--- {name}: {exc}")
    return "\n".join(parts)


@pytest.fixture(scope="session")
def wait_for():
    """``wait_for(job_id, env, states, timeout, restarts=0, output=None)``: poll until the job is
    in one of ``states`` (see :func:`_wait_for`); return its ``scontrol show job`` fields."""
    return _wait_for


def _wait_for(job_id: str, env: dict, states: tuple[str, ...], timeout: float,
              restarts: int = 0, output=None) -> dict:
    """Poll until the job is in one of ``states`` with at least ``restarts`` restarts.

    On timeout, cancel the job and fail with every (state, restarts) it went through and the
    cluster's log tails (and the job's ``output`` file when given): a job Slurm has forgotten
    shows as state None."""
    start = time.time()
    info: dict = {}
    seen: list[str] = []
    while time.time() < start + timeout:
        info = job_info(job_id, env)
        now = f"{info.get('JobState')}/{info.get('Restarts')}"
        if not seen or not seen[-1].endswith(" " + now):
            seen.append(f"{time.time() - start:.0f}s {now}")
        if info.get("JobState") in states and int(info.get("Restarts", 0)) >= restarts:
            return info
        time.sleep(1)
    subprocess.run(["scancel", job_id], env=env)
    pytest.fail(f"job {job_id} did not reach {states} (restarts >= {restarts}) in {timeout:.0f} "
                f"s; last state {info.get('JobState')}, restarts {info.get('Restarts')}; "
                f"state/restarts seen: {', '.join(seen)}\n{_cluster_logs()}{_tail(output)}")


def _tail(path, chars: int = 3000) -> str:
    """The end of the file at ``path`` (a job's output), or nothing without one."""
    if path is None:
        return ""
    try:
        with open(path) as f:
            return f"\n--- {path}\n" + f.read()[-chars:]
    except OSError as exc:
        return f"\n--- {path}: {exc}"
