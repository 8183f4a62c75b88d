"""Which MPI ``mpirun`` belongs to, and the flags hpcrep adds for it (hpcrep.launch.mpirun).

Detection is checked on the mpirun installed here (against the MPI library mpi4py loaded, which
the launched ranks use) and on the ``--version`` texts of the MPIs hpcrep knows; the flags are
checked through ``mpirun_command`` on small executables that print those texts."""

from __future__ import annotations

import os
import re
import stat

import pytest

from hpcrep.launch.mpirun import find_mpirun, flavor, mpirun_command, parse_version

OPEN_MPI_4 = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPEN_MPI_5 = "mpirun (Open MPI) 5.0.8\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
MPICH_4 = ("HYDRA build details:\n"
           "    Version:                                 4.1.2\n"
           "    Release Date:                            Wed Jun  7 15:22:45 CDT 2023\n"
           "    CC:                              gcc\n")
INTEL_MPI = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"


@pytest.mark.parametrize("text, expected", [
    (OPEN_MPI_4, ("openmpi", 4)),
    (OPEN_MPI_5, ("openmpi", 5)),
    (MPICH_4, ("mpich", 4)),
    ("HYDRA build details:\n    Version:                                 3.3a2\n",
     ("mpich", 3)),
    (INTEL_MPI, ("unknown", 0)),
    ("", ("unknown", 0)),
])
def test_version_texts(text, expected):
    assert parse_version(text) == expected


def test_the_installed_mpirun_is_the_mpi_that_mpi4py_loaded():
    from mpi4py import MPI

    library = MPI.Get_library_version()
    name = ("openmpi" if "Open MPI" in library else "mpich" if "MPICH" in library else "unknown")
    major = int(re.search(r"(\d+)\.\d+", library).group(1))
    assert flavor(find_mpirun()) == (name, major), library


def fake_mpirun(directory, name: str, text: str) -> str:
    """An executable that prints ``text`` for ``--version``, as an mpirun would."""
    path = directory / name
    path.mkdir()
    path = path / "mpirun"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_flags_follow_the_detected_mpi(tmp_path):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cases = {
        "ompi4": (OPEN_MPI_4, ["--oversubscribe", "--bind-to", "none", *root]),
        "ompi5": (OPEN_MPI_5, ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none", *root]),
        "mpich": (MPICH_4, []),
        "intel": (INTEL_MPI, []),
    }
    for name, (text, flags) in cases.items():
        mpirun = fake_mpirun(tmp_path, name, text)
        assert mpirun_command(4, ["prog", "arg"], mpirun=mpirun) == [
            mpirun, "-n", "4", *flags, "prog", "arg"], name
