"""Which recovery ``hpcrep run --elastic`` gives a job, chosen by itself.

In place (ULFM): the survivors of a failed rank shrink and go on in the same job, at the cost of
the steps since the last commit and a few seconds. By relaunch: every rank is started again and
resumes from the last commit (TensorFlow's start-up on every rank, each time). In place needs an
MPI with ULFM under the ranks' mpi4py: the MPI of the Python that runs ``hpcrep run``, or the
project's ``.venv-ulfm`` beside the checkout (``make ulfm``), under whose Python ``hpcrep run``
then runs itself. ``HPCREP_ELASTIC_RECOVERY=relaunch`` keeps the relaunch.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import hpcrep
from hpcrep import config
from hpcrep.launch.mpirun import has_ulfm

ULFM_VENV = ".venv-ulfm"  # what `make ulfm` builds at the top of the checkout


def project_ulfm_python(checkout: Optional[str] = None) -> Optional[str]:
    """Return the Python of the checkout's ULFM environment when it is usable (its ``mpirun``
    has ULFM) and is not the one running, else None. Local; runs ``ompi_info`` once."""
    root = checkout or os.path.dirname(os.path.dirname(os.path.abspath(hpcrep.__file__)))
    venv = os.path.join(root, ULFM_VENV)
    python, mpirun = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "mpirun")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return None
    if not (os.access(python, os.X_OK) and os.access(mpirun, os.X_OK)):
        return None
    return python if has_ulfm(mpirun) else None


def in_place_python(mpirun: str) -> Optional[str]:
    """Return the Python that ``hpcrep run --elastic`` should run under to recover in place:
    None when this one will do (its ``mpirun`` has ULFM), when none is at hand, or when
    ``HPCREP_ELASTIC_RECOVERY`` is ``relaunch``. Local."""
    if config.get("HPCREP_ELASTIC_RECOVERY").strip().lower() == "relaunch" or has_ulfm(mpirun):
        return None
    return project_ulfm_python()


def describe(mpirun: str, in_process: bool) -> str:
    """Return the start line that says which recovery the job has and what a failure costs."""
    if in_process:
        return (f"hpcrep run: elastic: recovery in place (ULFM, {mpirun}): a failed rank's "
                "survivors shrink and go on in the same job, losing the steps since the last "
                "commit and a few seconds; a job that fails as a whole is relaunched from its "
                "last commit")
    how = ("HPCREP_ELASTIC_RECOVERY=relaunch is set" if
           config.get("HPCREP_ELASTIC_RECOVERY").strip().lower() == "relaunch" else
           "for recovery in place (seconds, no restart) build the project's ULFM MPI with "
           "'make ulfm', or run hpcrep run under an MPI with ULFM (Open MPI 5)")
    return (f"hpcrep run: elastic: recovery by relaunch ({mpirun} has no ULFM): a failed job is "
            "started again on every rank and resumes from its last commit, losing the steps "
            f"since then and its start-up time; {how}")
