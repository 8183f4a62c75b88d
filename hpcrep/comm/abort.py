"""Abort the whole job, saying so in a line that launchers can watch for.

Every way hpcrep aborts a job (an unhandled exception under ``python -m hpcrep``, the stall
watchdog, :func:`hpcrep.comm.abort`) ends in :func:`abort`, which prints
:func:`abort_notice` on stderr and then calls ``MPI_Abort``. hpcrep's launchers
(:mod:`hpcrep.launch.supervise`) find the line in the job's stderr with
:data:`ABORT_NOTICE_PATTERN` and end an ``mpirun`` that would otherwise wait for a node it can no
longer reach.
"""

from __future__ import annotations

import re
import sys

ABORT_NOTICE = "hpcrep: job abort:"
ABORT_NOTICE_PATTERN = re.compile(re.escape(ABORT_NOTICE) + r" rank (\d+), exit code (\d+)")


# After survivors went on without lost ranks (hpcrep.comm.recovery), the launcher may wait for
# good for a node daemon it cannot reach; this line, printed by the survivors' rank 0 once all
# of them are exiting, lets the supervisor end it as it does after an abort.
DONE_NOTICE = "hpcrep: job done after losing ranks:"
DONE_NOTICE_PATTERN = re.compile(re.escape(DONE_NOTICE) + r" rank (\d+), exit code (\d+)")


def done_notice(rank: int, lost: str) -> str:
    """Return the line the survivors' rank 0 prints at exit after a recovery (exit code 0)."""
    return f"{DONE_NOTICE} rank {rank}, exit code 0 (lost: {lost})"


def abort_notice(rank: int, errorcode: int) -> str:
    """Return the line :func:`abort` prints: ``hpcrep: job abort: rank R, exit code C``."""
    return f"{ABORT_NOTICE} rank {rank}, exit code {errorcode}"


def abort(errorcode: int = 1) -> None:
    """Print :func:`abort_notice` on stderr, then abort every rank of the job (``MPI_Abort`` on
    ``COMM_WORLD``). Does not return.

    Local: only the calling rank needs to call it.
    """
    from mpi4py import MPI  # noqa: PLC0415 - MPI only when a job is aborted

    from hpcrep.comm import flight  # noqa: PLC0415

    sys.stdout.flush()
    rank = MPI.COMM_WORLD.Get_rank()
    flight.on_abort(rank)  # this rank's last collectives, to a file and stderr
    print(abort_notice(rank, errorcode), file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Abort(errorcode)
