"""``hpcrep run -n N script.py [args]``: start ``python -m hpcrep script.py`` on N ranks.

Outside Slurm it uses :func:`hpcrep.launch.mpirun.mpirun_command` (the flags this MPI needs to run
as root and with more ranks than cores); inside an allocation (``SLURM_JOB_ID`` set) it asks
:mod:`hpcrep.slurm` for the ``srun`` command, with the PMI plugin that matches the MPI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from hpcrep.launch.mpirun import find_mpirun, flavor, mpirun_command, mpirun_env
from hpcrep.slurm import environment, srun


def rank_command(script: str, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """Return what each rank runs: ``python -m hpcrep script args``."""
    return [python, "-m", "hpcrep", script, *args]


def build_command(n: Optional[int], script: str, args: Sequence[str], launcher: str = "auto",
                  environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Return the full launch argv for ``hpcrep run``.

    Raises:
        ValueError: ``n`` < 1, or no rank count outside Slurm.
    """
    if n is not None and n < 1:
        raise ValueError(f"-n must be at least 1, got {n}")
    slurm = environment.slurm(environ)
    if launcher == "auto":
        launcher = "srun" if slurm.in_allocation else "mpirun"
    command = rank_command(script, args)
    if launcher == "srun":
        family = flavor(find_mpirun())[0] if shutil.which("mpirun") else "openmpi"
        return srun.srun_command(n, command, srun.mpi_plugin(family))
    if n is None:
        raise ValueError("give the number of ranks: hpcrep run -n N script.py (outside Slurm "
                         "there is no allocation to take it from)")
    return mpirun_command(n, command)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``hpcrep run``'s arguments."""
    parser.add_argument("-n", "--np", type=int, default=None,
                        help="number of ranks (inside Slurm: default all tasks of the allocation)")
    parser.add_argument("--launcher", choices=("auto", "mpirun", "srun"), default="auto",
                        help="auto: srun inside a Slurm allocation, else mpirun")
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    parser.add_argument("script", help="the Python script to run on every rank")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")


def main(args: argparse.Namespace) -> int:
    """Run the script on N ranks and return the launcher's exit code."""
    try:
        argv = build_command(args.np, args.script, args.args, args.launcher)
    except (ValueError, FileNotFoundError) as exc:
        print(f"hpcrep run: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(" ".join(argv))
        return 0
    env = mpirun_env()
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not os.path.exists(args.script):
        print(f"hpcrep run: no script {args.script!r}", file=sys.stderr)
        return 2
    return subprocess.call(argv, env=env)
