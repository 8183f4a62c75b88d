"""``hpcrep slurm render|submit [options] -- command ...``: print or submit a batch script.

    hpcrep slurm render --nodes 2 --ntasks-per-node 4 --time 1:00:00 -- python train.py
    hpcrep slurm submit -N 1 --ntasks-per-node 4 --signal USR1@120 --requeue -J "resnet run" \
        --sbatch-option=--mail-type=END -- python train.py

Options are spelled as sbatch spells them; anything else goes through ``--sbatch-option``.

``submit`` validates everything first, then pipes the script to ``sbatch --parsable`` and
prints the job id.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Optional, Sequence

from hpcrep.errors import SlurmOptionError
from hpcrep.slurm.options import LAUNCHERS, MPI_PLUGINS, JobOptions, advice, parse_signal
from hpcrep.slurm.render import render


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``render`` and ``submit`` to the ``slurm`` sub-parser."""
    sub = parser.add_subparsers(dest="slurm_command", required=True)
    for name, help_text in (("render", "print the sbatch script"),
                            ("submit", "submit with sbatch and print the job id")):
        p = sub.add_parser(name, help=help_text)
        add_job_arguments(p)


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Add the job options to ``p``, spelled as sbatch spells them (hpcrep's older spellings
    ``--tasks-per-node`` and ``--signal-lead`` still work)."""
    p.add_argument("-J", "--job-name", default="hpcrep")
    p.add_argument("-N", "--nodes", type=int, default=1)
    p.add_argument("-n", "--ntasks", type=int, help="total ranks (default nodes x "
                   "ntasks-per-node)")
    p.add_argument("--ntasks-per-node", "--tasks-per-node", type=int, dest="tasks_per_node",
                   help="ranks per node (default 1, or as Slurm spreads --ntasks)")
    p.add_argument("-c", "--cpus-per-task", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=0)
    p.add_argument("--gres", help="generic resources, e.g. gpu:4")
    p.add_argument("-t", "--time", help="Slurm time limit: M, H:M:S, D-H:M ...")
    p.add_argument("-p", "--partition")
    p.add_argument("-A", "--account")
    p.add_argument("-q", "--qos")
    p.add_argument("-o", "--output", help="stdout path (%%j = job id)")
    p.add_argument("-e", "--error", help="stderr path")
    p.add_argument("--mem", help="memory per node, e.g. 16G")
    p.add_argument("--exclusive", action="store_true", help="whole nodes")
    p.add_argument("-C", "--constraint", help="node features")
    p.add_argument("--signal", help="sbatch's [{R|B}:]<signal>[@<seconds>]; USR1 makes ranks "
                   "checkpoint (and requeue with --requeue)")
    p.add_argument("--signal-lead", type=int, metavar="SECONDS",
                   help="same as --signal USR1@SECONDS")
    p.add_argument("--requeue", action="store_true", help="allow requeue (--requeue)")
    p.add_argument("--sbatch-option", action="append", default=[], dest="sbatch_options",
                   metavar="OPTION", help="any other #SBATCH option, one per flag (repeatable), "
                   "e.g. --sbatch-option=--mail-type=END")
    p.add_argument("--module", action="append", default=[], dest="modules",
                   help="module to load (repeatable)")
    p.add_argument("--setup", action="append", default=[],
                   help="shell line run before launch (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="variable to export (repeatable)")
    p.add_argument("--launcher", choices=LAUNCHERS, default="srun")
    p.add_argument("--mpi", choices=MPI_PLUGINS, default="pmix", help="srun --mpi plugin")
    p.add_argument("--checkpoint-dir", help="export HPCREP_CHECKPOINT_DIR")
    p.add_argument("--sbatch", default="sbatch", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")


def options_from_args(args: argparse.Namespace) -> JobOptions:
    """Build validated :class:`JobOptions` from parsed arguments.

    Raises:
        SlurmOptionError: an option is invalid (nothing has been submitted).
    """
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    env = []
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise SlurmOptionError(f"invalid env: expected NAME=VALUE; got {item!r}")
        env.append((key, value))
    lead, other_signal = args.signal_lead, None
    if args.signal is not None:
        if lead is not None:
            raise SlurmOptionError("give --signal or --signal-lead, not both")
        lead, other_signal = parse_signal(args.signal)
    tasks_per_node = args.tasks_per_node
    if tasks_per_node is None and args.ntasks is None:
        tasks_per_node = 1
    return JobOptions(command=tuple(command), job_name=args.job_name, nodes=args.nodes,
                      ntasks=args.ntasks, tasks_per_node=tasks_per_node,
                      cpus_per_task=args.cpus_per_task, gpus_per_node=args.gpus_per_node,
                      gres=args.gres, time=args.time, partition=args.partition,
                      account=args.account, qos=args.qos, output=args.output, error=args.error,
                      mem=args.mem, exclusive=args.exclusive, constraint=args.constraint,
                      modules=tuple(args.modules), setup=tuple(args.setup), env=tuple(env),
                      launcher=args.launcher, mpi=args.mpi, signal_lead=lead,
                      signal=other_signal, requeue=args.requeue,
                      sbatch_options=tuple(args.sbatch_options),
                      checkpoint_dir=args.checkpoint_dir)


def submit(script: str, sbatch: str = "sbatch", extra: Sequence[str] = ()) -> str:
    """Submit ``script`` with ``sbatch --parsable`` and return the job id.

    Raises:
        SlurmOptionError: sbatch is missing or rejected the script (its message is included).
    """
    try:
        done = subprocess.run([sbatch, "--parsable", *extra], input=script, text=True,
                              capture_output=True, timeout=120)
    except FileNotFoundError:
        raise SlurmOptionError(f"{sbatch} not found: run this on a Slurm login node") from None
    if done.returncode != 0:
        raise SlurmOptionError(f"sbatch rejected the job ({done.returncode}): "
                               f"{done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def main(args: argparse.Namespace, out: Optional[object] = None) -> int:
    """Run ``hpcrep slurm render`` or ``submit``."""
    out = out or sys.stdout
    try:
        options = options_from_args(args)
        script = render(options)
        for line in advice(options, os.environ):
            print(f"hpcrep slurm {args.slurm_command}: warning: {line}", file=sys.stderr)
        if args.slurm_command == "render":
            out.write(script)
        else:
            print(submit(script, args.sbatch), file=out)
    except SlurmOptionError as exc:
        print(f"hpcrep slurm {args.slurm_command}: {exc}", file=sys.stderr)
        return 2
    return 0
