"""Waiting ranks yield their core when a node holds more ranks than cores.

Open MPI keeps a rank that waits for a message spinning in its progress loop unless
``mpi_yield_when_idle`` is on, and turns it on by itself only when it knows the node is
oversubscribed: when ranks outnumber the node's *slots*. Slots given by hand (``-H node:8``, a
hostfile, a batch system that declares more CPUs than the node has) hide it, and a spinning rank
then takes the core from the rank it waits for (a step several times slower). Before MPI starts,
:func:`yield_if_oversubscribed` compares the ranks the launcher put on this node with the cores
this process may run on and, when ranks are more, sets ``OMPI_MCA_mpi_yield_when_idle=1`` for
this process's Open MPI. A value the user set is never changed. Other MPIs ignore the variable.
"""

from __future__ import annotations

import os
import re
from typing import Callable, MutableMapping, Optional

YIELD_VARIABLE = "OMPI_MCA_mpi_yield_when_idle"
_CPUSET = "/sys/fs/cgroup/cpuset.cpus.effective"


def ranks_on_this_node(environ: MutableMapping[str, str]) -> Optional[int]:
    """Return how many ranks of the job the launcher started on this node, from what it exported
    before MPI starts (Open MPI, MPICH's Hydra, Slurm's srun); None if none of them says. Local."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    per_node, node = environ.get("SLURM_STEP_TASKS_PER_NODE"), environ.get("SLURM_NODEID")
    if per_node and node is not None and node.isdigit():
        return _slurm_tasks_on_node(per_node, int(node))
    return None


def _slurm_tasks_on_node(per_node: str, node: int) -> Optional[int]:
    """Return node ``node``'s entry of Slurm's compressed list (``"2(x3),1"``). Pure."""
    index = 0
    for item in per_node.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not found:
            return None
        repeat = int(found.group(2) or 1)
        if index <= node < index + repeat:
            return int(found.group(1))
        index += repeat
    return None


def usable_cores(cpuset_path: str = _CPUSET) -> int:
    """Return the cores the ranks of this node may share: the cgroup's cpuset (a batch
    system's allocation) where the system has one, else every core of the machine. A rank's
    own affinity is not used: a launcher that binds each rank to one core does not oversubscribe.
    Local."""
    try:
        with open(cpuset_path) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    count = 0
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())):
            count = 0
            break
        count += int(high or low) - int(low) + 1
    return count or os.cpu_count() or 1


def yield_if_oversubscribed(environ: MutableMapping[str, str],
                            cores: Callable[[], int] = usable_cores) -> bool:
    """Set ``OMPI_MCA_mpi_yield_when_idle=1`` in ``environ`` when this node holds more ranks
    than cores and the user did not set it; return whether it was set. Call before MPI starts.
    Local."""
    if YIELD_VARIABLE in environ:
        return False
    ranks = ranks_on_this_node(environ)
    if ranks is None or ranks <= cores():
        return False
    environ[YIELD_VARIABLE] = "1"
    return True
