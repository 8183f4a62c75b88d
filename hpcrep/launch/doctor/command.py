"""``hpcrep doctor [-np N] [-H HOSTS | --hostfile F] [--json]``: diagnose this site for a job.

Prints one line per check (``ok``/``warn``/``FAIL``/``skip``, the finding; the fix), then a
summary; exits 0 when every check is ok or a warning, 1 when a job would fail, 2 on bad options.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any, Optional, Sequence

from hpcrep.errors import LaunchOptionError
from hpcrep.launch import hosts as hostlists
from hpcrep.launch.doctor.placement import Placement
from hpcrep.launch.doctor.result import exit_code, line, summary, to_json
from hpcrep.launch.doctor.run import run_checks
from hpcrep.slurm import environment


def placement_of(options: argparse.Namespace,
                 environ: Optional[dict] = None) -> Placement:
    """Return the placement ``hpcrep doctor`` or ``hpcrep run --check`` options describe (``np``,
    ``hosts``, ``hostfile``, and ``mpi_args``/``launcher`` when present).

    Raises:
        LaunchOptionError: a bad rank count, host list or hostfile, or more ranks than slots.
    """
    np = getattr(options, "np", None)
    if np is not None and np < 1:
        raise LaunchOptionError(f"-np must be at least 1, got {np}")
    hosts: list[hostlists.Host] = []
    given = ""
    if getattr(options, "hosts", None):
        hosts, given = hostlists.parse_hosts(options.hosts), f"-H {options.hosts}"
    elif getattr(options, "hostfile", None):
        hosts = hostlists.read_hostfile(options.hostfile)
        given = f"--hostfile {options.hostfile}"
    if hosts:
        hostlists.check_ranks(np, hosts, given)
    launcher = getattr(options, "launcher", "auto")
    if launcher == "auto":
        launcher = "srun" if environment.slurm(environ).in_allocation and not hosts else "mpirun"
    return Placement(np, tuple(hosts), given, tuple(shlex.split(getattr(options, "mpi_args", "")
                                                                or "")), launcher)


def diagnose(placement: Placement, as_json: bool = False) -> int:
    """Run every check for ``placement``, print them (lines as they come, or one JSON document)
    and return the exit code (0: ok or warnings, 1: a job would fail). Local."""
    def show(result: Any) -> None:
        print(line(result), flush=True)

    results = run_checks(placement, None if as_json else show)
    print(to_json(results) if as_json else summary(results), flush=True)
    return exit_code(results)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``hpcrep doctor``'s arguments."""
    parser.description = ("Check this site before a job: the MPI mpi4py loads against mpirun, "
                          "the compiled op, ULFM, Slurm's PMI plugin, cores against ranks and "
                          "threads, network interfaces, and a 2-rank allreduce.")
    parser.add_argument("-np", "-n", "--num-proc", "--np", dest="np", type=int, default=None,
                        help="ranks the job will have (for the cores check)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                       help="hosts of the job, as hpcrep run takes them")
    where.add_argument("--hostfile", "-hostfile", default=None, metavar="FILE",
                       help="hostfile of the job, as hpcrep run takes it")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def main(args: Any, prog: str = "hpcrep doctor") -> int:
    """Run the doctor for the placement ``args`` describe (``hpcrep doctor``'s, or ``hpcrep
    run``'s under ``--check``: ``prog`` names it in messages); return its exit code (2: bad
    options)."""
    try:
        placement = placement_of(args)
    except LaunchOptionError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return diagnose(placement, bool(getattr(args, "json", False)))


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Return ``hpcrep doctor``'s arguments parsed from ``argv``."""
    parser = argparse.ArgumentParser(prog="hpcrep doctor")
    configure(parser)
    return parser.parse_args(list(argv))
