"""The Slurm job this process runs in: the one table of Slurm variables hpcrep reads.

Read them through :func:`slurm` (never ``os.environ["SLURM_..."]`` inline); :func:`job_id` and
:func:`restart_count` are its two most asked questions. Under ``mpirun`` inside an allocation
every rank sees ``SLURM_PROCID=0``: take ranks from MPI, not from here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

# field -> (variable, meaning)
SLURM_VARIABLES: dict[str, tuple[str, str]] = {
    "job_id": ("SLURM_JOB_ID", "job id; set in every allocation (sbatch, salloc, srun)"),
    "ntasks": ("SLURM_NTASKS", "tasks in the allocation (srun -n default)"),
    "procid": ("SLURM_PROCID", "this task's rank under srun (0 under mpirun)"),
    "localid": ("SLURM_LOCALID", "this task's rank on its node under srun"),
    "nnodes": ("SLURM_JOB_NUM_NODES", "nodes in the allocation"),
    "nodelist": ("SLURM_JOB_NODELIST", "nodes of the allocation, compressed form"),
    "restart_count": ("SLURM_RESTART_COUNT", "times the job was requeued"),
    "step_id": ("SLURM_STEP_ID", "job step id; set inside srun"),
}


@dataclasses.dataclass(frozen=True)
class SlurmEnvironment:
    """The Slurm variables of :data:`SLURM_VARIABLES` (``None`` when unset)."""

    job_id: Optional[str] = None
    ntasks: Optional[int] = None
    procid: Optional[int] = None
    localid: Optional[int] = None
    nnodes: Optional[int] = None
    nodelist: Optional[str] = None
    restart_count: Optional[int] = None
    step_id: Optional[str] = None

    @property
    def in_allocation(self) -> bool:
        """True inside a Slurm allocation (``SLURM_JOB_ID`` set)."""
        return bool(self.job_id)


def slurm(environ: Optional[Mapping[str, str]] = None) -> SlurmEnvironment:
    """Return the Slurm variables of ``environ`` (default ``os.environ``), typed."""
    environ = os.environ if environ is None else environ
    values = {}
    for field in dataclasses.fields(SlurmEnvironment):
        raw = environ.get(SLURM_VARIABLES[field.name][0])
        if raw is not None and "int" in str(field.type):
            try:
                values[field.name] = int(raw)
            except ValueError:
                continue
        else:
            values[field.name] = raw
    return SlurmEnvironment(**values)


def job_id() -> Optional[str]:
    """Return this job's Slurm id, or None outside Slurm."""
    return slurm().job_id


def restart_count() -> int:
    """Return how many times Slurm has requeued this job (0 on the first run or outside Slurm)."""
    return slurm().restart_count or 0
