"""The job a doctor run is for: ranks, hosts and launcher, as ``hpcrep run`` would place them.

Pure functions apart from :func:`is_local` (which asks this machine for its names).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Mapping, Optional, Sequence

import hpcrep

from hpcrep.launch.hosts import Host

_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Ranks (None: not given), hosts (empty: this machine), where the hosts came from (for
    messages), extra launcher arguments (``--mpi-args``) and the launcher (mpirun or srun)."""

    np: Optional[int] = None
    hosts: tuple[Host, ...] = ()
    given: str = ""
    mpi_args: tuple[str, ...] = ()
    launcher: str = "mpirun"

    @property
    def ranks(self) -> Optional[int]:
        """The job's ranks: ``np``, else every slot of the hosts, else None."""
        if self.np is not None:
            return self.np
        return sum(h.slots for h in self.hosts) if self.hosts else None

    @property
    def multi_host(self) -> bool:
        """True when the ranks go to at least one host other than this machine."""
        return any(not is_local(h.name) for h in self.hosts)


def is_local(name: str) -> bool:
    """Return True if ``name`` names this machine. Local."""
    short = socket.gethostname().split(".")[0]
    return name in _LOCAL_NAMES or name.split(".")[0] == short


def ranks_per_host(ranks: int, hosts: Sequence[Host]) -> list[int]:
    """Return how many of ``ranks`` each host gets when they fill the hosts' slots in order
    (Open MPI's and Hydra's default), ``[ranks]`` for no hosts (all on this machine)."""
    if not hosts:
        return [ranks]
    out, left = [], ranks
    for host in hosts:
        take = min(host.slots, left)
        out.append(take)
        left -= take
    return out


def child_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Return ``environ`` (default os.environ) with this process's hpcrep first on PYTHONPATH, so
    that a child Python run with ``-P`` (no working directory on its path) imports the same hpcrep
    as the doctor. Local."""
    env = dict(os.environ if environ is None else environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(hpcrep.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env
