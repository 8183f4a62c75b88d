"""Doctor check that runs a real job: a 2-rank allreduce started by the launcher ``hpcrep run``
would use (local ranks; one rank on each of the first two hosts of ``-H``/``--hostfile``; srun
inside an allocation), reporting latency and bandwidth against a rough expectation.

Locally the expectation is a share of rank 0's memcpy bandwidth measured in the same job
(shared-memory allreduce copies each byte a few times); across hosts the figures are reported
for comparison with the link's rate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Optional

from hpcrep.launch import hosts as hostlists
from hpcrep.launch.doctor.placement import Placement, child_env
from hpcrep.launch.doctor.result import FAIL, OK, WARN, Result
from hpcrep.launch.doctor.site import mca_setting
from hpcrep.launch.mpirun import (find_mpirun, flavor, forward_arguments, mpirun_command,
                                  mpirun_env)
from hpcrep.slurm import srun

NBYTES = 64 << 20
# Rough expectations: a 2-rank shared-memory allreduce moves its buffer at no less than this
# share of a memcpy, and answers a one-number allreduce within this many seconds.
LOCAL_SHARE = 1 / 40
LOCAL_LATENCY = 200e-6
_PROBE = "hpcrep.launch.doctor.allreduce_probe"


def probe_argv(placement: Placement, family: str, mpirun: Optional[str] = None,
               python: str = sys.executable) -> list[str]:
    """Return the command that runs the 2-rank probe where ``placement`` puts ranks. Local."""
    command = [python, "-P", "-m", _PROBE, str(NBYTES)]
    if placement.launcher == "srun":
        return srun.srun_command(2, [*placement.mpi_args, *command], srun.mpi_plugin(family))
    extra: list[str] = []
    if placement.multi_host:
        two = [hostlists.Host(h.name, 1) for h in placement.hosts[:2]]
        if len(two) < 2:
            two = [hostlists.Host(placement.hosts[0].name, 2)]
        names = [n for n in ("PYTHONPATH",) if n in os.environ]
        extra = forward_arguments(names, family) + hostlists.host_arguments(two, family)
    return mpirun_command(2, command, mpirun=mpirun, extra=extra + list(placement.mpi_args))


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    env = mpirun_env({**child_env(), "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -1, out, f"no answer within {timeout:g} s"
    return proc.returncode, out, err


def check_allreduce(placement: Placement, timeout: float = 120) -> Result:
    """Run the 2-rank probe and judge what it measured. Starts an MPI job of 2 ranks. Local."""
    name = "allreduce"
    try:
        mpirun = None if placement.launcher == "srun" else find_mpirun()
    except FileNotFoundError as exc:
        return Result(name, FAIL, "no mpirun to start the test job", str(exc))
    family = flavor(mpirun)[0] if mpirun else "openmpi"
    argv = probe_argv(placement, family, mpirun)
    code, out, err = _run(argv, timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        tail = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        return Result(name, FAIL, f"a 2-rank allreduce did not run ({argv[0]}): {tail}",
                      "run it by hand to see the whole error: " + " ".join(argv))
    btl = mca_setting("btl", placement.mpi_args, os.environ)
    return judge(json.loads(lines[-1]), placement.multi_host, argv[0], btl)


def shared_memory(btl: str) -> bool:
    """Return True if Open MPI's ``btl`` setting (``tcp,self,vader``, or ``^tcp`` to exclude)
    keeps a shared-memory transport (vader in Open MPI 4, sm in 5). Pure."""
    names = set(btl.lstrip("^").split(","))
    return not names & {"vader", "sm"} if btl.startswith("^") else bool(names & {"vader", "sm"})


def judge(found: dict, across_hosts: bool, launcher: str = "mpirun", btl: str = "") -> Result:
    """Return the check's result for what the probe measured (``found``), with Open MPI's
    ``btl`` setting (empty: its default). Pure."""
    name = "allreduce"
    if found["size"] != 2:
        return Result(name, FAIL, f"{launcher} started ranks that see a world of size "
                      f"{found['size']}, not 2: each rank is a singleton",
                      "give srun the --mpi plugin of this MPI (see the slurm line)")
    if not found["correct"]:
        return Result(name, FAIL, "the 2-rank allreduce returned a wrong sum",
                      "check the MPI installation (mpi-library line)")
    latency_us, gbs = found["latency"] * 1e6, found["bandwidth"] / 1e9
    memcpy = found["memcpy"] / 1e9
    mb = found["bytes"] >> 20
    where = " and ".join(sorted(set(found["hosts"])))
    figures = (f"2 ranks on {where} via {os.path.basename(launcher)}: 8-byte allreduce "
               f"{latency_us:.1f} us, {mb} MB allreduce {gbs:.2f} GB/s")
    if across_hosts:
        return Result(name, OK, f"{figures} (compare with the link's rate)")
    if btl and not shared_memory(btl):
        return Result(name, WARN, f"{figures}; btl={btl} leaves out shared memory, so local "
                      "ranks talk over TCP", "add vader (Open MPI 4) or sm (Open MPI 5) to btl, "
                      "or unset it")
    low = found["bandwidth"] < LOCAL_SHARE * found["memcpy"]
    slow = found["latency"] > LOCAL_LATENCY
    if low or slow:
        busy = found.get("load", 0) > found.get("cores", 1)
        load = (f" (load average {found['load']:.1f} on {found['cores']} cores: other "
                "processes take the cores)" if busy else "")
        return Result(name, WARN, f"{figures}{load}; expected at least "
                      f"{LOCAL_SHARE * memcpy:.2f} GB/s "
                      f"(1/{round(1 / LOCAL_SHARE)} of memcpy {memcpy:.1f} GB/s) and under "
                      f"{LOCAL_LATENCY * 1e6:.0f} us on shared memory",
                      "check that shared memory is used (no --mca btl tcp,self) and that "
                      "nothing else takes the cores")
    return Result(name, OK, f"{figures} (memcpy {memcpy:.1f} GB/s in the same run)")
