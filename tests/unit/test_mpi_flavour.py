"""The compiled op is built once per MPI binary interface (hpcrep.comm.world.mpi_flavour): Open
MPI 4 and 5 each load their own library from the same checkout."""

import os
import subprocess
import sys

import pytest

from hpcrep.comm import world
from hpcrep.tensorflow.native import build


@pytest.mark.parametrize("line, flavour", [
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022",
     "openmpi4"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11", "openmpi5"),
    ("MPICH Version:\t4.1.2", "mpich4"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", "intelmpi2021"),
])
def test_the_flavour_names_the_vendor_and_major_version(line, flavour):
    assert world.mpi_flavour(line) == flavour


def test_an_unknown_library_gets_a_stable_name_of_its_own():
    a, b = world.mpi_flavour("Some MPI 1.0"), world.mpi_flavour("Some MPI 2.0")
    assert a.startswith("mpi-") and a != b and a == world.mpi_flavour("Some MPI 1.0")


def test_each_flavour_has_its_own_library_and_stamp_beside_the_sources():
    four, five = build.library_path("openmpi4"), build.library_path("openmpi5")
    assert four != five and os.path.dirname(four) == os.path.dirname(five) == build.HERE
    assert build.stamp_path("openmpi5").endswith("_hpcrep_ops.openmpi5.json")


def test_the_running_mpi_is_read_without_initialising_it():
    """What install.sh's check and ``python -m hpcrep.tensorflow.native`` do: no MPI_Init."""
    code = ("from hpcrep.tensorflow.native import build; flavour, version = build.running_mpi(); "
            "from mpi4py import MPI; print(flavour, MPI.Is_initialized(), '\\0' in version)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == [world.mpi_flavour(world.mpi_library_version()), "False", "False"], out
