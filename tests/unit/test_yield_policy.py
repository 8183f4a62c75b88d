"""Waiting ranks yield on a node that holds more ranks than cores (hpcrep.comm.yield_policy):
the ranks per node are read from what each launcher exports before MPI starts."""

import os

import pytest

from hpcrep.comm.yield_policy import (YIELD_VARIABLE, ranks_on_this_node, usable_cores,
                                      yield_if_oversubscribed)


@pytest.mark.parametrize("environ, ranks", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),                            # Open MPI's mpirun
    ({"MPI_LOCALNRANKS": "3"}, 3),                                       # MPICH's Hydra
    ({"SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NODEID": "0"}, 4),         # srun
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2"}, 2),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "4"}, None),
    ({"SLURM_STEP_TASKS_PER_NODE": "odd", "SLURM_NODEID": "0"}, None),
    ({}, None),                                                           # a plain python run
])
def test_ranks_on_this_node_from_each_launcher(environ, ranks):
    assert ranks_on_this_node(environ) == ranks


@pytest.mark.parametrize("environ, cores, set_to", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 2, "1"),                  # -H localhost:4 on 2 cores
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2, None),                 # one rank a core: spin
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", YIELD_VARIABLE: "0"}, 2, "0"),  # the user's choice
    ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_NODEID": "0"}, 2, "1"),
    ({}, 1, None),
])
def test_yield_only_when_ranks_outnumber_cores_and_the_user_said_nothing(environ, cores,
                                                                         set_to):
    user_set = YIELD_VARIABLE in environ
    environ = dict(environ)
    assert yield_if_oversubscribed(environ, cores=lambda: cores) == (set_to == "1"
                                                                     and not user_set)
    assert environ.get(YIELD_VARIABLE) == set_to


@pytest.mark.parametrize("text, cores", [("0-3", 4), ("0,2,4-5", 4), ("7", 1)])
def test_usable_cores_counts_the_cgroup_cpuset(tmp_path, text, cores):
    path = tmp_path / "cpuset.cpus.effective"
    path.write_text(text + "\n")
    assert usable_cores(str(path)) == cores


def test_usable_cores_without_a_cpuset_is_the_machine(tmp_path):
    assert usable_cores(str(tmp_path / "absent")) == os.cpu_count()
