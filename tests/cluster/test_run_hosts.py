"""``hpcrep run -np 4 -H node1:2,node2:2 script`` across the two nodes, as a Horovod user types
``horovodrun``: an explicit-API script runs as it is (one SGD step is the whole batch's step,
weights equal on all 4 ranks) and an unchanged Keras script runs in transparent mode. The launch
settings of the cluster (its launch agent, the bridge) come from ``tests/cluster/mpi-args.sh``
through ``--mpi-args``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest


def hpcrep_run(cluster, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``hpcrep run -np 4 -H <node1>:2,<node2>:2 --mpi-args ... --verbose ARGV``."""
    hosts = ",".join(f"{node}:2" for node in cluster.nodes[:2])
    command = [sys.executable, "-m", "hpcrep.cli", "run", "-np", "4", "-H", hosts,
               f"--mpi-args={cluster.mpi_args()}", "--verbose", *argv]
    env = cluster.env(PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                  os.environ.get("PYTHONPATH", "")]))
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=cluster.root)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hpcrep run across the cluster did not end within {timeout} s\n"
                    f"{exc.stderr}")


def hosts_of_ranks(done) -> list[str]:
    """The --host argument hpcrep run passed to mpirun (from --verbose)."""
    return re.findall(r" --host (\S+) ", done.stderr)


@pytest.mark.timeout(360)
def test_explicit_api_script_across_two_nodes(cluster, tmp_path, explicit_step_ok):
    done = hpcrep_run(cluster, "tests/launch/run_explicit_job.py", str(tmp_path))
    print(done.stderr[-1500:])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert hosts_of_ranks(done) == [f"{cluster.nodes[0]}:2,{cluster.nodes[1]}:2"]
    assert "explicit API, run as it is" in done.stderr
    assert "hpcrep transparent mode" not in done.stdout + done.stderr
    explicit_step_ok(tmp_path, 4)
    placed = [str(np.load(tmp_path / f"rank{r}.npz")["host"]) for r in range(4)]
    assert placed == [cluster.nodes[0]] * 2 + [cluster.nodes[1]] * 2, placed


@pytest.mark.timeout(360)
def test_unchanged_keras_script_across_two_nodes(cluster, transparent_run_ok):
    done = hpcrep_run(cluster, "tests/launch/run_plain_job.py")
    print(done.stderr[-1500:])
    assert hosts_of_ranks(done) == [f"{cluster.nodes[0]}:2,{cluster.nodes[1]}:2"]
    transparent_run_ok(done, 4)
    placed = sorted(re.findall(r"weights-digest [0-9a-f]{64} on (\S+)", done.stderr))
    assert placed == [cluster.nodes[0]] * 2 + [cluster.nodes[1]] * 2, placed
