"""Requeue the running job: ``scontrol requeue``.

After a pre-timeout signal (``--signal=USR1@N``) and a checkpoint, the job asks Slurm to run it
again: Slurm ends this run and starts the job later, with ``SLURM_RESTART_COUNT`` increased
(:func:`hpcrep.slurm.environment.restart_count`). The job must have been submitted with
``--requeue``.
"""

from __future__ import annotations

import subprocess
from typing import Optional

from hpcrep.errors import SlurmError
from hpcrep.slurm import environment


def requeue(job_id: Optional[str] = None, scontrol: str = "scontrol") -> None:
    """Ask Slurm to requeue job ``job_id`` (default: this job). Local: call it on one rank.

    Raises:
        SlurmError: not inside Slurm, or ``scontrol requeue`` failed.
    """
    job_id = job_id or environment.job_id()
    if not job_id:
        raise SlurmError("requeue needs a Slurm job: SLURM_JOB_ID is not set and no job id was "
                         "given; run inside an sbatch job submitted with --requeue")
    try:
        done = subprocess.run([scontrol, "requeue", job_id], capture_output=True, text=True,
                              timeout=60)
    except FileNotFoundError as exc:
        raise SlurmError(f"requeue of job {job_id} needs {scontrol!r}, which was not found: "
                         "run it on a node of the Slurm cluster") from exc
    if done.returncode != 0:
        raise SlurmError(f"scontrol requeue {job_id} failed ({done.returncode}): "
                         f"{done.stderr.strip()}")
