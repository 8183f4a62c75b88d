"""The stall watchdog's abort on one node: one rank of 4 never enters an allreduce, and with
``HPCREP_STALL_TIMEOUT=4`` the whole job ends by itself, mpirun exits non-zero, every rank's
process is gone, and the report names the collective, the tensor and the rank that never came.

The cross-node case (a cut link) is tests/cluster/test_launcher_ends.py; this one needs no root.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpcrep.launch.mpirun import mpirun_command

HERE = Path(__file__).resolve().parent
RANKS, MISSING, STALL_TIMEOUT = 4, 2, 4
# From the moment every rank is running to mpirun's exit: the timeout, the watchdog's 1 s poll,
# MPI_Abort (or the watchdog's own exit 5 s later) and mpirun tearing the job down. 60 s leaves
# room for a loaded 2-core machine; without the abort the job would wait for the sleeping rank
# for 600 s.
BOUND = 60


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _pids(prefix: Path) -> list[int]:
    found = []
    for r in range(RANKS):
        try:
            found.append(int((prefix.parent / f"{prefix.name}.{r}").read_text()))
        except (OSError, ValueError):
            return []
    return found


@pytest.mark.timeout(300)
def test_a_rank_that_never_arrives_ends_the_whole_job(mpirun, scratch):
    prefix = scratch / "pid"
    command = [mpirun.python, str(HERE / "stall_job.py"), str(prefix), str(MISSING)]
    proc = subprocess.Popen(mpirun_command(RANKS, command), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=mpirun.env({"HPCREP_STALL_TIMEOUT": str(STALL_TIMEOUT),
                                            "HPCREP_FLIGHT_DIR": str(scratch),
                                            "SLURM_JOB_ID": "stall"}))
    try:
        deadline = time.monotonic() + 180  # start-up (imports on a loaded machine)
        while not (pids := _pids(prefix)) and proc.poll() is None:
            assert time.monotonic() < deadline, "the ranks did not start within 180 s"
            time.sleep(0.1)
        assert pids, f"the job ended before every rank started:\n{proc.communicate()[0][-3000:]}"
        started = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"mpirun still running {BOUND} s after the ranks started "
                        f"(HPCREP_STALL_TIMEOUT={STALL_TIMEOUT}): the watchdog did not end the job")
        ended = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid in _pids(prefix):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

    assert proc.returncode != 0, out[-3000:]
    assert ended >= STALL_TIMEOUT - 1, f"the job ended after {ended:.1f} s, before the timeout"
    gone = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], f"rank processes outlived mpirun: {pids}"
    assert "the allreduce returned" not in out, out[-3000:]
    report = re.search(r"collective allreduce of 'stuck\.grad' \(call #\d+ here\) has not "
                       r"completed after .*?\(0 turns the watchdog off\)\.", out, re.S)
    assert report, out[-3000:]
    assert re.search(rf"no answer from rank {MISSING} on \S+", report.group(0)), report.group(0)
    # the line hpcrep's launchers watch for (hpcrep.launch.supervise), after the report
    notice = re.search(r"hpcrep: job abort: rank (\d+), exit code 75", out)
    assert notice and int(notice.group(1)) != MISSING and notice.start() > report.start(), \
        out[-3000:]
    print(f"\nwatchdog abort: mpirun exited {proc.returncode} {ended:.1f} s after the ranks "
          f"started (HPCREP_STALL_TIMEOUT={STALL_TIMEOUT}). The report:\n{report.group(0)}")
    # The flight recorder: the aborting rank's summary and its file (hpcrep/comm/flight.py).
    reporter = re.search(r"hpcrep: rank (\d+) on \S+: collective allreduce of 'stuck\.grad'", out)
    assert reporter, out[-3000:]
    job = re.escape(str(HERE / "stall_job.py"))
    assert re.search(r"flight recorder: the histories of ranks [\d, ]+ agree \(last call #2\); "
                     r"last collectives here:\n    #1 barrier of no tensors \(the job\) from "
                     rf"{job}:\d+ in main: took", out), out[-3000:]
    record = json.loads((scratch / f"hpcrep-flight-stall-rank{reporter.group(1)}.json").read_text())
    assert record["reason"] == "stall abort" and record["in_flight"]["names"] == ["stuck.grad"]
    assert [(e["kind"], e["end"] is None) for e in record["entries"]] == [("barrier", False),
                                                                         ("allreduce", True)]
