"""The multi-node cluster of tests/cluster (``up.sh``): find it, or skip (fail under CI=true).

``make test-cluster`` starts it (``tests/cluster/up.sh --nodes 2``), runs these tests, the
collective suite across the nodes and tests/slurm on it, then removes it (``down.sh``). Tests
reach it through the ``cluster`` fixture: MPI jobs across the nodes, Slurm clients, fault
injection.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER_DIR = Path(os.environ.get("HPCREP_CLUSTER_DIR", "/tmp/hpcrep-cluster"))


@dataclasses.dataclass
class Cluster:
    """The running cluster: its nodes, and how to run on them (from the repository ``root``)."""

    nodes: list[str]
    root: Path

    def env(self, **extra: str) -> dict:
        """The environment for jobs on the cluster (quiet TensorFlow, Slurm's config, this
        Python for mpirun.sh's launcher supervisor)."""
        env = dict(os.environ)
        env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", HPCREP_THREADS="1",
                   SLURM_CONF=str(CLUSTER_DIR / "slurm.conf"), PYTHON=sys.executable)
        env.update(extra)
        return env

    def mpirun_argv(self, options: Sequence[str], command: Sequence[str]) -> list[str]:
        """The argv of ``tests/cluster/mpirun.sh OPTIONS -- COMMAND``."""
        return [str(HERE / "mpirun.sh"), *options, "--", *command]

    def mpi_args(self, mpirun: str = "") -> str:
        """The mpirun options of mpirun.sh (less its hostfile), one string for
        ``hpcrep run --mpi-args``: ``tests/cluster/mpi-args.sh`` (Open MPI 5's names when
        ``mpirun`` is an Open MPI 5 one)."""
        return subprocess.run([str(HERE / "mpi-args.sh"), *([mpirun] if mpirun else [])],
                              check=True, capture_output=True, text=True,
                              timeout=30).stdout.strip()

    def mpirun(self, options: Sequence[str], command: Sequence[str], timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess:
        """Run an MPI job across the nodes; fail the test (after killing it) past ``timeout``."""
        proc = self.popen(options, command, **env)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"MPI job across the cluster did not end within {timeout} s: "
                        f"{command}\n{out[-4000:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")

    def popen(self, options: Sequence[str], command: Sequence[str], **env: str
              ) -> subprocess.Popen:
        """Start an MPI job across the nodes (stdout and stderr merged, own process group)."""
        return subprocess.Popen(self.mpirun_argv(options, command), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env(**env),
                                cwd=self.root, start_new_session=True)

    def fault(self, action: str, node: str) -> None:
        """``cut`` or ``heal`` a node's link (tests/cluster/cut.sh, heal.sh)."""
        subprocess.run(["bash", str(HERE / f"{action}.sh"), node], check=True,
                       capture_output=True, text=True, timeout=30)

    def wait_until_nodes_run(self, patience: float = 120) -> Optional[float]:
        """Return seconds until a job runs on every node again (after a heal: a healed link can
        take a while to carry the launcher's connections again), or None after ``patience``."""
        start = time.monotonic()
        while time.monotonic() - start < patience:
            proc = self.popen(["-n", str(len(self.nodes)), "--map-by", "ppr:1:node"], ["true"])
            try:
                if proc.wait(timeout=30) == 0:
                    return time.monotonic() - start
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            time.sleep(2)
        return None

    @staticmethod
    def wait_until_gone(pids: Sequence[int], timeout: float) -> Optional[float]:
        """Return seconds until every process in ``pids`` has exited, or None after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if not any(_alive(p) for p in pids):
                return time.monotonic() - start
            time.sleep(0.1)
        return None


def _nodes() -> list[str]:
    try:
        return (CLUSTER_DIR / "nodes").read_text().split()
    except OSError:
        return []


@pytest.fixture(scope="session")
def cluster(skip_missing, repo) -> Cluster:
    """The running cluster of at least 2 nodes (skips, or fails under CI, without one)."""
    if os.geteuid() != 0:
        skip_missing("root, for the multi-node cluster (tests/cluster/up.sh needs it)")
    nodes = _nodes()
    if len(nodes) < 2:
        skip_missing(f"a multi-node cluster: run tests/cluster/up.sh --nodes 2 as root first "
                     f"(found {len(nodes)} node(s) in {CLUSTER_DIR})")
    return Cluster(nodes, repo)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False

