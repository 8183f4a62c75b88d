"""``hpcrep doctor``: diagnose a site before a job, one check per trap that otherwise stays silent.

Each check is a function returning a :class:`~hpcrep.launch.doctor.result.Result` (name, ok /
warn / fail / skip, a one-line finding, a one-line fix): the MPI library mpi4py loads against the
mpirun (:mod:`.mpi`), the compiled op (:mod:`.native`), ULFM (:mod:`.mpi`), Slurm's PMI plugins,
cores against ranks and threads, network interfaces (:mod:`.site`), and a real 2-rank allreduce
(:mod:`.allreduce`). :func:`run_checks` runs them all for a :class:`Placement`;
:mod:`.command` is the command line (also ``hpcrep run --check``).
"""

from __future__ import annotations

from hpcrep.launch.doctor.placement import Placement
from hpcrep.launch.doctor.result import FAIL, OK, SKIP, WARN, Result, exit_code, line, summary
from hpcrep.launch.doctor.run import run_checks

__all__ = ["Placement", "Result", "OK", "WARN", "FAIL", "SKIP", "run_checks", "exit_code", "line",
           "summary"]
