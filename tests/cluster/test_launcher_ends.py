"""A cut link ends every rank and the launcher too.

hpcrep's stall watchdog ends every rank about ``HPCREP_STALL_TIMEOUT`` seconds after a link is
cut, with a report naming the ranks that did not answer. The launcher's own failure detection is
left at Open MPI's default here (TCP keepalive after 300 s idle), so the watchdog alone ends the
ranks, as under a launcher that would not notice (srun notices a dead node only after
SlurmdTimeout). Open MPI 4.1's ``mpirun`` then waits for the daemon of the node it cannot reach;
in a batch job it would hold the allocation until the time limit. hpcrep's launchers run it
under :mod:`hpcrep.launch.supervise`, which ends it ``HPCREP_LAUNCHER_GRACE`` seconds after a
rank's abort notice. Checked: ``tests/cluster/mpirun.sh`` and ``hpcrep run -H``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = "tests/cluster/allreduce_loop.py"
STALL_TIMEOUT = 20
BOUND = 50       # seconds from the cut to the launcher's exit
PATIENCE = 90    # how long the test waits before it kills a launcher that did not end


def _progress(prefix: Path, rank: int) -> tuple[int, int]:
    try:
        pid, step = (prefix.parent / f"{prefix.name}.{rank}").read_text().split()
        return int(pid), int(step)
    except (OSError, ValueError):
        return 0, 0


def _start(cluster, launcher: str, prefix: Path) -> subprocess.Popen:
    job = [sys.executable, JOB, str(prefix)]
    settings = {"HPCREP_STALL_TIMEOUT": str(STALL_TIMEOUT),
                "HPCREP_FLIGHT_DIR": str(prefix.parent),  # the nodes share this machine's /tmp
                "OMPI_MCA_oob_tcp_keepalive_time": "300"}  # the watchdog alone ends the ranks
    if launcher == "mpirun.sh":
        return cluster.popen(["-n", "4", "--map-by", "ppr:2:node"], job, **settings)
    hosts = ",".join(f"{node}:2" for node in cluster.nodes[:2])
    argv = [sys.executable, "-m", "hpcrep.cli", "run", "-np", "4", "-H", hosts,
            f"--mpi-args={cluster.mpi_args()}", JOB, str(prefix)]
    env = cluster.env(PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                  os.environ.get("PYTHONPATH", "")]),
                      **settings)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cluster.root, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(420)
# In the gate of 2026-11-26 "hpcrep run", run right after the mpirun.sh case, never started:
# node2's daemon could not open a TCP connection back to the host after the heal. Each case now
# waits after its heal until a job runs on both nodes again (Cluster.wait_until_nodes_run).
@pytest.mark.parametrize("launcher", ["mpirun.sh", "hpcrep run"])
def test_launcher_exits_within_50_s_of_a_cut_link(cluster, tmp_path, launcher):
    prefix = tmp_path / "progress"
    proc = _start(cluster, launcher, prefix)
    try:
        deadline = time.monotonic() + 240  # four TensorFlow start-ups on 2 cores
        while not all(_progress(prefix, r)[1] >= 5 for r in range(4)):
            if proc.poll() is not None:
                pytest.fail(f"the job ended before step 5:\n{proc.stdout.read()[-4000:]}")
            assert time.monotonic() < deadline, "the ranks did not reach step 5 in 240 s"
            time.sleep(0.1)
        pids = [_progress(prefix, r)[0] for r in range(4)]
        cluster.fault("cut", "node2")
        cut = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            out = None
        ended = time.monotonic() - cut
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.fault("heal", "node2")
        cluster.wait_until_nodes_run()
    if out is None:
        out, _ = proc.communicate()
        pytest.fail(f"{launcher}: the launcher was still running {PATIENCE} s after the cut "
                    f"(HPCREP_STALL_TIMEOUT={STALL_TIMEOUT}):\n{out[-4000:]}")
    report = re.search(r"hpcrep: rank [01] on node1: collective .*? has not completed after.*?"
                       r"\(0 turns the watchdog off\)\.", out, re.S)
    print(f"\n{launcher}: link cut; the launcher exited {ended:.1f} s later with code "
          f"{proc.returncode} (HPCREP_STALL_TIMEOUT={STALL_TIMEOUT})")
    assert proc.returncode != 0, out[-4000:]
    assert ended <= BOUND, f"{launcher} exited {ended:.1f} s after the cut:\n{out[-4000:]}"
    assert ended >= STALL_TIMEOUT / 2, f"ended {ended:.1f} s after the cut, before the watchdog"
    assert report, f"no watchdog report from node1 in the launcher's output:\n{out[-4000:]}"
    assert "no answer from ranks 2, 3 on node2" in report.group(0), report.group(0)
    # The flight recorder (hpcrep/comm/flight.py): node1's waiting ranks agree on their history,
    # and the file of the rank that reported holds the request it waited in (compiled path).
    summary = re.search(r"flight recorder: the histories of ranks [01, ]+ agree .*", out)
    assert summary, out[-4000:]
    print(f"{launcher}: {summary.group(0)}")
    reporter = re.search(r"hpcrep: rank ([01]) on node1: collective .*? has not completed", out)
    record = json.loads(next(tmp_path.glob(f"hpcrep-flight-*-rank{reporter.group(1)}.json"))
                        .read_text())
    assert record["reason"] == "stall abort", record
    assert record["in_flight"]["waited_s"] >= STALL_TIMEOUT, record["in_flight"]
    gone = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], f"ranks still alive after the launcher: {pids}"
