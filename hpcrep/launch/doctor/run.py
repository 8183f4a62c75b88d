"""Run every doctor check, in order, for one placement of a job."""

from __future__ import annotations

from typing import Callable, Optional

from hpcrep.launch.doctor.allreduce import check_allreduce
from hpcrep.launch.doctor.mpi import check_mpi_library, check_ulfm, mpi_family
from hpcrep.launch.doctor.native import check_native
from hpcrep.launch.doctor.placement import Placement
from hpcrep.launch.doctor.result import FAIL, SKIP, Result
from hpcrep.launch.doctor.site import check_cores, check_network, check_slurm


def run_checks(placement: Placement,
               report: Optional[Callable[[Result], None]] = None) -> list[Result]:
    """Return the result of every check for ``placement``, calling ``report`` on each as it is
    known. The allreduce job is skipped when the MPI check failed (it would only hang or crash
    the same way), and so is ULFM's (it would describe the wrong MPI). Local (the last check
    starts a 2-rank job)."""
    results: list[Result] = []

    def add(result: Result) -> None:
        results.append(result)
        if report is not None:
            report(result)

    mpi = check_mpi_library()
    add(mpi)
    add(check_native())
    add(check_ulfm() if mpi.status != FAIL else
        Result("ulfm", SKIP, "not judged: mpi4py's MPI is not the launcher's (see mpi-library)"))
    family = mpi_family()
    add(check_slurm(family))
    add(check_cores(placement))
    add(check_network(placement))
    if mpi.status == FAIL:
        add(Result("allreduce", SKIP, "not run: mpi4py's MPI is not the launcher's (see "
                   "mpi-library)"))
    else:
        add(check_allreduce(placement))
    return results
