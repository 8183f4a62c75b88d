"""``hpcrep run --elastic -H node1:2,node2:2`` without ULFM, node2's link cut mid-run: the stall
watchdog ends the ranks, the launcher supervisor ends mpirun, the probe finds node2 gone, and
the same ``hpcrep run`` relaunches the job on node1's 2 slots from the last commit; it finishes
there and ``hpcrep run`` exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

JOB = "tests/launch/elastic_job.py"
STALL_TIMEOUT = 20


@pytest.mark.timeout(600)
def test_a_cut_node_is_left_out_and_the_job_relaunched_from_its_last_commit(cluster, tmp_path):
    hosts = ",".join(f"{node}:2" for node in cluster.nodes[:2])
    elastic_dir = tmp_path / "commits"
    argv = [sys.executable, "-m", "hpcrep.cli", "run", "-np", "4", "-H", hosts, "--elastic",
            "--min-np", "2", f"--mpi-args={cluster.mpi_args()}", JOB, "--epochs", "40",
            "--epoch-sleep", "0.5", "--out", str(tmp_path / "final.npz")]
    env = cluster.env(PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                  os.environ.get("PYTHONPATH", "")]),
                      HPCREP_STALL_TIMEOUT=str(STALL_TIMEOUT), HPCREP_ELASTIC_DIR=str(elastic_dir),
                      OMPI_MCA_oob_tcp_keepalive_time="300",  # the watchdog alone ends the ranks
                      HPCREP_ELASTIC_RECOVERY="relaunch")  # not .venv-ulfm's in-place recovery
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cluster.root, start_new_session=True)
    lines: list[str] = []
    cut = None
    try:
        deadline = time.monotonic() + 400
        for line in proc.stdout:
            lines.append(line)
            if cut is None and "rank 0 finished epoch 3 " in line:
                cluster.fault("cut", cluster.nodes[1])
                cut = time.time()
            assert time.monotonic() < deadline, "".join(lines)[-4000:]
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.fault("heal", cluster.nodes[1])
        cluster.wait_until_nodes_run()  # for the tests after this one
    out = "".join(lines)
    for line in out.splitlines():
        if "elastic:" in line:
            print(line)
    assert cut is not None, out[-4000:]
    assert proc.returncode == 0, out[-4000:]
    assert f"no longer reachable: {cluster.nodes[1]}" in out, out[-4000:]
    assert f"relaunching 2 rank(s) on {cluster.nodes[0]}:2 from the last commit" in out, out
    starts = [int(e) for e in re.findall(r"rank 0 starts at epoch (\d+)", out)]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= 4, starts
    finished = [(int(e), float(t)) for e, t in
                re.findall(r"rank 0 finished epoch (\d+) at ([0-9.]+)", out)]
    epochs = [e for e, _ in finished]
    # what the second attempt trained follows the commit it resumed from, up to the end
    assert epochs[epochs.index(starts[1]):] == list(range(starts[1], 40)), epochs
    resumed = next(t for e, t in finished if e == starts[1] and t > cut)
    print(f"\nlink cut; first epoch of the relaunched job done {resumed - cut:.1f} s later "
          f"(HPCREP_STALL_TIMEOUT={STALL_TIMEOUT}); {len(epochs)} epochs logged")

