"""Doctor checks of the site around MPI: Slurm's PMI plugins, cores against ranks and threads,
and the network interfaces Open MPI's TCP transport will use.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from typing import Mapping, Optional, Sequence

from hpcrep import config
from hpcrep.comm.yield_policy import YIELD_VARIABLE, usable_cores
from hpcrep.launch.doctor.placement import Placement, ranks_per_host
from hpcrep.launch.doctor.result import FAIL, OK, SKIP, WARN, Result
from hpcrep.slurm import environment, srun


def srun_plugins(text: str) -> list[str]:
    """Return the plugin names of what ``srun --mpi=list`` printed (``MPI plugin types are...``
    then one name a line, or ``srun: mpi/pmix`` lines in older Slurm). Pure."""
    names = []
    for raw in text.splitlines():
        item = raw.strip().removeprefix("srun:").strip()
        if not item or " " in item or item.endswith(":"):
            continue
        names.append(item.removeprefix("mpi/"))
    return names


def check_slurm(family: str, environ: Optional[Mapping[str, str]] = None) -> Result:
    """Inside an allocation, or with ``srun`` on PATH: whether ``srun --mpi=list`` offers the
    plugin hpcrep would pick for this MPI (``family``: openmpi, mpich). A missing plugin starts
    N singletons of size 1. Local."""
    name = "slurm"
    inside = environment.slurm(environ).in_allocation
    where = shutil.which("srun")
    if where is None:
        if inside:
            return Result(name, FAIL, "inside a Slurm allocation but srun is not on PATH",
                          "load the Slurm module or add Slurm's bin directory to PATH")
        return Result(name, SKIP, "srun is not on PATH and this is no Slurm allocation: hpcrep "
                      "run uses mpirun")
    wanted = srun.mpi_plugin(family)
    try:
        done = subprocess.run([where, "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = subprocess.CompletedProcess([], 1, "", str(exc))
    plugins = srun_plugins(done.stdout + done.stderr) if done.returncode == 0 else []
    if not plugins:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if not inside:
            return Result(name, SKIP, f"{where} is on PATH but answers no plugin list ({tail}) "
                          "and this is no Slurm allocation: hpcrep run uses mpirun")
        return Result(name, FAIL, f"{where} --mpi=list failed ({tail}): srun cannot start "
                      "this job", "check Slurm's configuration (SLURM_CONF, slurmctld reachable)")
    if wanted not in plugins:
        return Result(name, FAIL if inside else WARN,
                      f"srun offers --mpi={','.join(plugins)} but not {wanted}, which {family} "
                      "needs: a wrong plugin starts N singletons of size 1",
                      f"install Slurm's {wanted} plugin (for pmix: libpmix-dev), or run with "
                      "hpcrep run --launcher mpirun")
    tail = "inside this allocation hpcrep run uses srun" if inside else \
        "hpcrep run uses it inside an allocation"
    return Result(name, OK, f"srun offers --mpi={wanted} for {family}; {tail}")


def check_cores(placement: Placement, cores: Optional[int] = None,
                environ: Optional[Mapping[str, str]] = None) -> Result:
    """Cores of this machine against the ranks on the busiest node and ``HPCREP_THREADS``:
    warn when they oversubscribe (waiting ranks then yield; ranks x threads should be about the
    cores). Assumes the other hosts have as many cores as this one. Local."""
    name = "cores"
    cores = usable_cores() if cores is None else cores
    threads = int(config.get("HPCREP_THREADS"))
    ranks = placement.ranks
    if ranks is None:
        return Result(name, OK, f"{cores} cores here; no -np given: up to {cores} ranks of 1 "
                      "thread each fit a node")
    per_node = max(ranks_per_host(ranks, placement.hosts))
    each = threads if threads > 0 else max(1, cores // per_node)
    env = os.environ if environ is None else environ
    if per_node > cores:
        yielded = env.get(YIELD_VARIABLE)
        how = (f"{YIELD_VARIABLE}={yielded} is set by you" if yielded is not None
               else "hpcrep sets mpi_yield_when_idle so waiting ranks yield their core")
        return Result(name, WARN, f"{per_node} ranks on a node of {cores} cores oversubscribe "
                      f"it ({each} thread(s) each): {how}, but steps run slower than with "
                      "one rank per core", f"use -np {cores} per node, or more nodes; keep "
                      "ranks x HPCREP_THREADS ~ cores")
    if per_node * each > cores:
        return Result(name, WARN, f"{per_node} ranks x HPCREP_THREADS={threads} = "
                      f"{per_node * each} threads on {cores} cores: threads compete",
                      f"set HPCREP_THREADS={max(1, cores // per_node)} (0: automatic)")
    return Result(name, OK, f"{per_node} rank(s) per node x {each} thread(s) on {cores} cores")


def interfaces(text: str) -> list[tuple[str, str]]:
    """Return (interface, address/prefix) of every IPv4 address in ``ip -o addr`` output. Pure."""
    out = []
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) >= 4 and parts[2] == "inet":
            out.append((parts[1].rstrip(":"), parts[3]))
    return out


def _matches(entry: str, iface: str, address: str) -> bool:
    if "/" not in entry:
        return entry == iface
    try:
        net = ipaddress.ip_network(entry, strict=False)
        return ipaddress.ip_interface(address).ip in net
    except ValueError:
        return False


def tcp_interfaces(found: Sequence[tuple[str, str]], include: str, exclude: str
                   ) -> list[tuple[str, str]]:
    """Return the (interface, address) of ``found`` that Open MPI's TCP transport uses under
    ``btl_tcp_if_include`` / ``btl_tcp_if_exclude`` (comma-separated names or subnets; an
    empty exclude means Open MPI's default, loopback). Pure."""
    if include:
        wanted = [e.strip() for e in include.split(",") if e.strip()]
        return [(i, a) for i, a in found if any(_matches(e, i, a) for e in wanted)]
    unwanted = [e.strip() for e in (exclude or "127.0.0.1/8,sppp").split(",") if e.strip()]
    return [(i, a) for i, a in found if not any(_matches(e, i, a) for e in unwanted)]


def mca_setting(name: str, mpi_args: Sequence[str], environ: Mapping[str, str]) -> str:
    """Return Open MPI parameter ``name`` as the job would get it: ``--mca NAME V`` in
    ``mpi_args``, else ``OMPI_MCA_NAME``, else ``~/.openmpi/mca-params.conf``; "" if unset."""
    args = list(mpi_args)
    for i, arg in enumerate(args[:-2]):
        if arg in ("--mca", "-mca") and args[i + 1] == name:
            return args[i + 2]
    if environ.get(f"OMPI_MCA_{name}"):
        return environ[f"OMPI_MCA_{name}"]
    try:
        with open(os.path.expanduser("~/.openmpi/mca-params.conf")) as f:
            for raw in f:
                key, _, value = raw.partition("=")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def _ip_addr() -> str:
    try:
        return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def check_network(placement: Placement, environ: Optional[Mapping[str, str]] = None) -> Result:
    """The interfaces (with IPv4 addresses) Open MPI's TCP transport will use; warn when a run
    across hosts would have only loopback. Local."""
    name = "network"
    env = os.environ if environ is None else environ
    include = mca_setting("btl_tcp_if_include", placement.mpi_args, env)
    exclude = mca_setting("btl_tcp_if_exclude", placement.mpi_args, env)
    text = _ip_addr()
    found = interfaces(text)
    if not text:
        names = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
        return Result(name, WARN, f"cannot list addresses (no ip command); interfaces: "
                      f"{', '.join(names) or 'none'}", "apt-get install iproute2")
    used = tcp_interfaces(found, include, exclude)
    chosen = f"btl_tcp_if_include={include}" if include else \
        f"btl_tcp_if_exclude={exclude}" if exclude else "Open MPI's default: all but loopback"
    listed = ", ".join(f"{i} {a}" for i, a in used) or "none"
    real = [(i, a) for i, a in used if not a.startswith("127.")]
    if placement.multi_host and not real:
        return Result(name, WARN, f"ranks on other hosts but TCP would use {listed} ({chosen}): "
                      "only loopback or nothing", "set --mca btl_tcp_if_include <subnet of the "
                      "hosts> (--mpi-args) or OMPI_MCA_btl_tcp_if_include")
    where = "between hosts" if placement.multi_host else "if ranks span hosts (local ranks use " \
        "shared memory)"
    return Result(name, OK, f"TCP {where}: {listed} ({chosen})",
                  "" if len(real) <= 1 or include else
                  "with several networks, pin the fast one: --mca btl_tcp_if_include <subnet>")
