"""``hpcrep run``: start a script on N ranks, with horovodrun's options.

Outside Slurm it uses :func:`hpcrep.launch.mpirun.mpirun_command` (the flags this MPI needs to run
as root and with more ranks than cores) and places ranks on the hosts of ``-H``/``--hostfile``
(:mod:`hpcrep.launch.hosts`); inside an allocation (``SLURM_JOB_ID`` set) it asks
:mod:`hpcrep.slurm` for the ``srun`` command, with the PMI plugin that matches the MPI.

Each rank runs ``python -m hpcrep script`` (transparent mode) when the script does not use the
explicit API, else ``python -m hpcrep --no-transparent script`` (as it is, with ``horovod.*``
mapped to hpcrep where Horovod is missing); :mod:`hpcrep.launch.script_api` reads the script to
choose, ``--transparent``/``--no-transparent`` override it. horovodrun's feature options set
their ``HPCREP_*`` setting on every rank (:data:`OPTION_SETTINGS`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Mapping, Optional, Sequence

from hpcrep import config, config_check
from hpcrep.errors import LaunchOptionError
from hpcrep.launch import hosts as hostlists
from hpcrep.launch import recovery_choice, relaunch
from hpcrep.launch.heal_watch import HealWatch
from hpcrep.launch.mpirun import (env_arguments, find_mpirun, flavor, forward_arguments, has_ulfm,
                                  mpirun_command, mpirun_env, ulfm_arguments)
from hpcrep.launch.script_api import EXPLICIT_MODULES, ExplicitImport, script_imports
from hpcrep.launch.supervise import supervise
from hpcrep.slurm import environment, srun


# horovodrun's feature options: the setting each sets on every rank (argparse dest, flag, name).
OPTION_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("max_np", "--max-np", "HPCREP_ELASTIC_MAX_NP"),
    ("batches_per_commit", "--batches-per-commit", "HPCREP_ELASTIC_BATCHES_PER_COMMIT"),
    ("timeline_filename", "--timeline-filename", "HPCREP_TIMELINE"),
    ("timeline_steps", "--timeline-steps", "HPCREP_TIMELINE_STEPS"),
    ("autotune", "--autotune", "HPCREP_AUTOTUNE"),
    ("autotune_log_file", "--autotune-log-file", "HPCREP_AUTOTUNE_LOG"),
)

_PYTHON = re.compile(r"^python[0-9.]*$")

EPILOG = """\
examples:
  hpcrep run -np 4 train.py --epochs 3          4 local ranks (srun inside a Slurm allocation)
  hpcrep run -np 4 -H node1:2,node2:2 train.py  2 ranks on each of two hosts
  hpcrep run -np 8 --hostfile hosts.txt train.py     lines 'node1 slots=4' (or 'node1:4')
  hpcrep run -np 4 python train.py              horovodrun's form: the ranks use that python
  hpcrep run -np 2 --mpi-args "--mca btl tcp,self" train.py    extra mpirun arguments
  hpcrep run -np 4 --verbose --dry-run train.py    show the mode chosen and the command
  hpcrep run --check -np 4 -H node1:2,node2:2 train.py   run hpcrep doctor for this job instead

mode: a script that imports hpcrep.tensorflow, hpcrep.keras or horovod.* (anywhere in it)
runs as it is, on every rank (python -m hpcrep --no-transparent); horovod.tensorflow and
horovod.keras are hpcrep's modules there when Horovod is not installed. Any other script runs
in transparent mode (python -m hpcrep). --transparent / --no-transparent override the choice.

horovodrun -> hpcrep run: -np/--num-proc, -H/--hosts, --hostfile, --verbose, --mpi-args: the
same. --timeline-filename FILE (or --timeline; --timeline-steps A:B) sets HPCREP_TIMELINE
(HPCREP_TIMELINE_STEPS) on every rank. --autotune (--autotune-log-file FILE) sets
HPCREP_AUTOTUNE (HPCREP_AUTOTUNE_LOG). --elastic (--reset-limit, --min-np, --max-np): with
an MPI that has ULFM (Open MPI 5) the survivors of a failed rank go on in the same job, stop
below --min-np, and grow back up to --max-np ranks at a commit when slots are free again;
otherwise the job is relaunched from its last hvd.elastic commit on the hosts still reachable
(--max-np is refused there). --batches-per-commit N: a transparent fit also commits every N
batches of array input, so a failure loses at most N steps instead of an epoch.

settings: every HPCREP_* variable is checked first (a misspelt name, a bad value: one line each,
exit 2, nothing launched); with -H/--hostfile each is passed to the other hosts (-x NAME).

inside a Slurm allocation srun starts the ranks where the allocation is, so -H and --hostfile
are an error there (a warning would run ranks elsewhere than you asked): leave them out, or use
--launcher mpirun to place ranks yourself.
"""


@dataclasses.dataclass(frozen=True)
class Launch:
    """What ``hpcrep run`` starts: the launcher's argv, settings for its environment, the mode
    and the imports that chose it, and which launcher it is (``mpirun`` or ``srun``)."""

    argv: list[str]
    script: str
    env: dict[str, str]
    transparent: bool
    found: tuple[ExplicitImport, ...]
    reason: str
    launcher: str = "mpirun"


def rank_command(script: str, args: Sequence[str], python: str = sys.executable,
                 transparent: bool = True) -> list[str]:
    """Return what each rank runs: ``python -m hpcrep [--no-transparent] script args``."""
    mode = [] if transparent else ["--no-transparent"]
    return [python, "-m", "hpcrep", *mode, script, *args]


def feature_settings(options: argparse.Namespace) -> list[tuple[str, str]]:
    """Return ``(setting, value)`` for each option of :data:`OPTION_SETTINGS` that was given.

    Raises:
        LaunchOptionError: a value does not parse as its setting's.
    """
    out = []
    for dest, flag, setting in OPTION_SETTINGS:
        value = getattr(options, dest, None)
        if value is None or value is False:
            continue
        text = "1" if value is True else str(value)
        try:
            config.SETTINGS[setting].parse(text)
        except ValueError as exc:
            raise LaunchOptionError(f"{flag} {text!r}: {exc}") from None
        out.append((setting, text))
    return out


def _mode(options: argparse.Namespace) -> tuple[bool, tuple[ExplicitImport, ...], str]:
    if options.transparent is not None:
        flag = "--transparent" if options.transparent else "--no-transparent"
        return options.transparent, (), f"{flag} given"
    found = tuple(script_imports(options.script))
    if not found:
        return True, (), (f"{options.script} imports none of {', '.join(EXPLICIT_MODULES)}: "
                          "transparent mode")
    where = ", ".join(f"{f.module} (line {f.line})" for f in found)
    return False, found, f"{options.script} imports {where}: explicit API, run as it is"


def _hosts(options: argparse.Namespace) -> tuple[list[hostlists.Host], str]:
    if options.hosts:
        return hostlists.parse_hosts(options.hosts), f"-H {options.hosts}"
    if options.hostfile:
        return hostlists.read_hostfile(options.hostfile), f"--hostfile {options.hostfile}"
    return [], ""


def _python_and_script(options: argparse.Namespace) -> tuple[str, str, list[str]]:
    """horovodrun's ``... python train.py`` form: the ranks run that python."""
    script, args = options.script, list(options.args)
    if not _PYTHON.match(os.path.basename(script)):
        return sys.executable, script, args
    if not args or args[0].startswith("-"):
        raise LaunchOptionError(f"give the script right after {script} (hpcrep run -np 2 "
                                f"{script} train.py); python options are not passed")
    return script, args[0], args[1:]


def build_launch(options: argparse.Namespace, environ: Optional[Mapping[str, str]] = None,
                 mpirun: Optional[str] = None,
                 settings: Sequence[tuple[str, str]] = ()) -> Launch:
    """Return what ``hpcrep run`` with ``options`` (its parsed arguments) starts. Reads the
    script (to choose the mode) and a hostfile; starts nothing. ``settings`` (name, value)
    reach every rank besides the options' own (``HPCREP_ELASTIC_DIR`` under ``--elastic``).
    With hosts (``-H``, ``--hostfile``) every other ``HPCREP_*`` variable of ``environ``
    (default ``os.environ``) is forwarded to them (:func:`~hpcrep.launch.mpirun.forward_arguments`).

    Raises:
        LaunchOptionError: a bad rank count, host list or hostfile, more ranks than slots, hosts
            under srun, an option not available yet, or a script that cannot be read.
        FileNotFoundError: no mpirun is installed (outside Slurm).
    """
    if options.np is not None and options.np < 1:
        raise LaunchOptionError(f"-np must be at least 1, got {options.np}")
    python, script, args = _python_and_script(options)
    options = argparse.Namespace(**{**vars(options), "script": script, "args": args})
    settings = feature_settings(options) + list(settings)
    _check_elastic(options)
    transparent, found, reason = _mode(options)
    command = rank_command(script, args, python, transparent)
    extra = shlex.split(options.mpi_args or "")
    launcher = options.launcher
    if launcher == "auto":
        launcher = "srun" if environment.slurm(environ).in_allocation else "mpirun"
    if launcher == "srun":
        if options.hosts or options.hostfile:
            flag = "-H" if options.hosts else "--hostfile"
            raise LaunchOptionError(f"{flag} cannot be used with srun: inside a Slurm "
                                    "allocation the allocation places the ranks; leave it out, "
                                    "or add --launcher mpirun to place them yourself")
        try:
            family = flavor(mpirun or find_mpirun())[0]
        except FileNotFoundError:
            family = "openmpi"
        if options.elastic:
            raise LaunchOptionError("--elastic relaunches through mpirun; inside a Slurm "
                                    "allocation use --launcher mpirun, or Slurm's requeue "
                                    "(slurm/README.md) with HPCREP_ELASTIC_DIR set")
        argv = srun.srun_command(options.np, [*extra, *command], srun.mpi_plugin(family))
        return Launch(argv, script, dict(settings), transparent, found, reason, "srun")
    hosts, given = _hosts(options)
    n = hostlists.check_ranks(options.np, hosts, given) if hosts else options.np
    if n is None:
        raise LaunchOptionError("give the number of ranks: hpcrep run -np N script.py (outside "
                                "Slurm there is no allocation to take it from)")
    mpirun = mpirun or find_mpirun()
    family = flavor(mpirun)[0]
    placed: list[str] = []
    if hosts:  # ranks on other hosts get only what mpirun forwards: every HPCREP_* set here
        given = {name for name, _ in settings}
        names = sorted(name for name in (os.environ if environ is None else environ)
                       if name.startswith(config_check.PREFIX) and name not in given)
        placed = forward_arguments(names, family) + hostlists.host_arguments(hosts, family)
    extra = placed + env_arguments(settings, family) + extra
    return Launch(mpirun_command(n, command, mpirun=mpirun, extra=extra), script, dict(settings),
                  transparent, found, reason)


def _check_elastic(options: argparse.Namespace) -> None:
    """Refuse ``--min-np``/``--reset-limit`` values that cannot work (LaunchOptionError)."""
    elastic = getattr(options, "elastic", False)
    min_np = getattr(options, "min_np", None)
    if min_np is not None and not elastic:
        raise LaunchOptionError("--min-np applies to --elastic (the least ranks a relaunch may "
                                "have); add --elastic or leave --min-np out")
    if min_np is not None and (min_np < 1 or (options.np is not None and min_np > options.np)):
        raise LaunchOptionError(f"--min-np {min_np}: give a number from 1 to -np "
                                f"({options.np})")
    max_np = getattr(options, "max_np", None)
    if max_np is not None and not elastic:
        raise LaunchOptionError("--max-np applies to --elastic (the size a job that lost ranks "
                                "grows back to); add --elastic or leave --max-np out")
    if max_np is not None and (max_np < 1 or (options.np is not None and max_np < options.np)
                               or (min_np is not None and max_np < min_np)):
        raise LaunchOptionError(f"--max-np {max_np}: give at least -np ({options.np}) and "
                                "--min-np")
    every = getattr(options, "batches_per_commit", None)
    if every is not None and not elastic:
        raise LaunchOptionError("--batches-per-commit applies to --elastic (how often a "
                                "transparent fit commits); add --elastic or leave it out")
    if every is not None and every < 1:
        raise LaunchOptionError(f"--batches-per-commit {every}: give 1 or more batches")
    if elastic and getattr(options, "reset_limit", 0) < 0:
        raise LaunchOptionError(f"--reset-limit {options.reset_limit}: give 0 or more "
                                "relaunches")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``hpcrep run``'s arguments (horovodrun's names) and its examples."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = "Run a Python script on N ranks: mpirun, or srun inside Slurm."
    parser.epilog = EPILOG
    parser.add_argument("-np", "-n", "--num-proc", "--np", dest="np", type=int, default=None,
                        help="number of ranks (default: all slots of -H/--hostfile; inside "
                             "Slurm all tasks of the allocation)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. node1:2,node2:2 (a host alone: 1 slot)")
    where.add_argument("--hostfile", "-hostfile", default=None, metavar="FILE",
                       help="one host a line: 'host slots=N' (horovodrun, Open MPI) or 'host:N'")
    parser.add_argument("--elastic", action="store_true", default=False,
                        help="after a failure, relaunch from the last hvd.elastic commit "
                             "(HPCREP_ELASTIC_DIR) on the hosts still reachable")
    parser.add_argument("--reset-limit", type=int, default=3, metavar="N",
                        help="with --elastic: relaunch at most N times (default 3)")
    parser.add_argument("--min-np", type=int, default=None,
                        help="with --elastic: relaunch only if at least this many ranks fit "
                             "on the hosts still reachable (default 1)")
    parser.add_argument("--max-np", type=int, default=None,
                        help="with --elastic on an MPI with ULFM: after ranks were lost, grow "
                             "back up to this many at a commit: into free slots of the hosts "
                             "the job still runs on, and onto a lost host that answers again "
                             "(a relaunch from the commit) (HPCREP_ELASTIC_MAX_NP)")
    parser.add_argument("--batches-per-commit", type=int, default=None, metavar="N",
                        help="with --elastic, transparent mode: fit also commits every N "
                             "batches of array input, not only at epoch ends "
                             "(HPCREP_ELASTIC_BATCHES_PER_COMMIT)")
    parser.add_argument("--timeline-filename", "--timeline", dest="timeline_filename",
                        default=None, metavar="FILE",
                        help="record a merged timeline of every rank's collectives and steps; "
                             "rank 0 writes FILE (Chrome trace JSON; `hpcrep analyze FILE`)")
    parser.add_argument("--timeline-steps", default=None, metavar="A:B",
                        help="record only training steps A to B (counted from 0) in the "
                             "timeline")
    parser.add_argument("--autotune", action="store_true", default=False,
                        help="tune the fusion threshold and piece size of the gradient "
                             "exchange while training, from measured step times")
    parser.add_argument("--autotune-log-file", default=None, metavar="FILE",
                        help="with --autotune: rank 0 writes every timed setting to FILE (CSV)")
    parser.add_argument("--mpi-args", default=None, metavar="'ARGS'",
                        help="extra arguments for the launcher (mpirun; srun inside Slurm), "
                             "passed as they are; one that starts with '-' and has no space: "
                             "--mpi-args=--cpu-bind=none")
    parser.add_argument("--transparent", action=argparse.BooleanOptionalAction, default=None,
                        help="run in transparent mode or not (default: read the script)")
    parser.add_argument("--verbose", action="store_true",
                        help="print the mode chosen and why, and the full launch command")
    parser.add_argument("--launcher", choices=("auto", "mpirun", "srun"), default="auto",
                        help="auto: srun inside a Slurm allocation, else mpirun")
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    parser.add_argument("--check", action="store_true",
                        help="run hpcrep doctor for this job's placement instead of the job; "
                             "exit code as the doctor's")
    parser.add_argument("script", help="the Python script to run on every rank")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Return ``hpcrep run``'s arguments parsed from ``argv`` (what follows ``hpcrep run``)."""
    parser = argparse.ArgumentParser(prog="hpcrep run")
    configure(parser)
    args = parser.parse_args(list(argv))
    args.argv = list(argv)  # as given: --elastic may run them again under another Python
    return args


def forward(name: str, argv: Sequence[str]) -> int:
    """``hpcrep run ARGV`` (:mod:`hpcrep.cli` hands the arguments over unparsed)."""
    return main(parse(argv))


def main(args: Any) -> int:
    """Run the script on N ranks and return the launcher's exit code (2: bad options).

    mpirun runs under :func:`hpcrep.launch.supervise.supervise` (ended if it outlives a job that
    a rank has aborted by more than ``HPCREP_LAUNCHER_GRACE`` seconds); srun as it is.
    First, with nothing launched yet, the ``HPCREP_*`` settings the ranks will get are checked
    (:mod:`hpcrep.config_check`; the directories are checked by rank 0 itself)."""
    found = config_check.problems()
    if found:
        config_check.report(found)
        return config_check.EXIT_CODE
    if args.check:  # the doctor for this job's placement, nothing launched
        from hpcrep.launch.doctor import command as doctor  # noqa: PLC0415

        return doctor.main(args, prog="hpcrep run")
    try:
        launch = build_launch(args)
    except (LaunchOptionError, FileNotFoundError) as exc:
        print(f"hpcrep run: {exc}", file=sys.stderr)
        return 2
    if args.verbose:
        print(f"hpcrep run: {launch.reason}", file=sys.stderr)
        for name, value in launch.env.items():
            print(f"hpcrep run: {name}={value} on every rank", file=sys.stderr)
        print(f"hpcrep run: {shlex.join(launch.argv)}", file=sys.stderr, flush=True)
    if args.dry_run:
        print(shlex.join(launch.argv))
        return 0
    if not os.path.exists(launch.script):
        print(f"hpcrep run: no script {launch.script!r}", file=sys.stderr)
        return 2
    env = mpirun_env({**os.environ, **launch.env})
    env.setdefault("PYTHONUNBUFFERED", "1")
    if launch.launcher == "srun":
        return subprocess.call(launch.argv, env=env)
    if args.elastic:
        better = recovery_choice.in_place_python(find_mpirun())
        if better is not None and getattr(args, "argv", None) is not None:
            print(f"hpcrep run: elastic: this MPI has no ULFM; running under {better} (the "
                  "project's MPI with ULFM, make ulfm), whose ranks recover in place",
                  file=sys.stderr, flush=True)
            sys.stderr.flush()
            os.execv(better, [better, "-m", "hpcrep.cli", "run", *args.argv])
        return _run_elastic(args, env)
    return supervise(launch.argv, env=env)


def _run_elastic(args: argparse.Namespace, env: dict) -> int:
    """``--elastic``: run under :func:`hpcrep.launch.relaunch.run_elastic`, each attempt built
    for its rank count and hosts, with ``HPCREP_ELASTIC_DIR`` on every rank."""
    hosts, given = _hosts(args)
    ranks = hostlists.check_ranks(args.np, hosts, given) if hosts else args.np
    mpirun = find_mpirun()
    family = flavor(mpirun)[0]
    extra = shlex.split(args.mpi_args or "")
    in_process = has_ulfm(mpirun)
    if args.max_np is not None and not in_process:
        raise LaunchOptionError(
            f"--max-np: growing a job back needs an MPI with ULFM (Open MPI 5: make ulfm, then "
            f".venv-ulfm/bin/python -m hpcrep.cli run ...); {mpirun} has none, so a failed job "
            "is relaunched on the hosts still reachable instead. Leave --max-np out.")
    print(recovery_choice.describe(mpirun, in_process), file=sys.stderr, flush=True)

    def launch(n: int, where: Sequence[hostlists.Host], attempt_env: dict) -> int:
        mpi_args = args.mpi_args or ""
        if in_process:
            mpi_args = shlex.join(ulfm_arguments(config.get("HPCREP_ULFM_DETECT_TIMEOUT"))) + \
                " " + mpi_args
        placed = argparse.Namespace(**{
            **vars(args), "np": n, "hostfile": None, "mpi_args": mpi_args,
            "hosts": ",".join(f"{h.name}:{h.slots}" for h in where) or None})
        built = build_launch(placed, mpirun=mpirun, settings=[
            ("HPCREP_ELASTIC_DIR", attempt_env["HPCREP_ELASTIC_DIR"]),
            # transparent mode's fit commits each epoch (python -m hpcrep --elastic): with ULFM
            # it goes on in the job, without it a relaunch resumes there; a job that stops to
            # grow is relaunched here; the survivors stop below --min-np (--max-np passes as
            # HPCREP_ELASTIC_MAX_NP)
            ("HPCREP_TRANSPARENT_ELASTIC", "1"),
            ("HPCREP_ELASTIC_RELAUNCH", "1"),
            *([("HPCREP_ELASTIC_MIN_NP", str(args.min_np))]
              if in_process and args.min_np else [])])
        if args.verbose:
            print(f"hpcrep run: {shlex.join(built.argv)}", file=sys.stderr, flush=True)
        if not (in_process and args.max_np and hosts):
            return supervise(built.argv, env=attempt_env)
        # a host the shrunk job lost entirely comes back through a relaunch (hosts_back)
        with HealWatch(attempt_env["HPCREP_ELASTIC_DIR"], hosts, probe, attempt_env):
            return supervise(built.argv, env=attempt_env)

    def probe(host: hostlists.Host) -> list[str]:
        return mpirun_command(1, ["true"], mpirun=mpirun,
                              extra=hostlists.host_arguments([host], family) + extra)

    return relaunch.run_elastic(launch, ranks, hosts, env, args.reset_limit, args.min_np or 1,
                                probe_argv=probe, max_np=args.max_np or 0)
