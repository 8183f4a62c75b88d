"""hpcrep.comm.check.agree across 2 real ranks, called directly: the gap mutation testing found.

The collective suite (tests/mpi/test_mismatch.py) checks mismatches through the collectives;
`make mutation` runs one-process tests only, and without these it had no test that runs
:func:`~hpcrep.comm.check.agree` itself. Each test also calls ``agree`` in this process (one
rank), so that mutmut, which maps tests to the functions they call in-process, runs them for
agree's mutants; the 2-rank job imports the same ``hpcrep`` as this process (under mutmut: the
mutated copy).
"""

import os
import sys
from pathlib import Path

import hpcrep
from hpcrep.comm import check

JOB = Path(__file__).resolve().parent / "agree_job.py"
HPCREP_ROOT = str(Path(hpcrep.__file__).resolve().parents[1])


def run_job(mpirun, tmp_path, case):
    from mpi4py import MPI

    assert check.agree(MPI.COMM_SELF, ("allreduce", ("Sum",), (("w", "float32", (3,)),))) is None
    env = {"PYTHONPATH": os.pathsep.join([HPCREP_ROOT, os.environ.get("PYTHONPATH", "")])}
    folder = tmp_path / case
    folder.mkdir()
    out = mpirun.run(2, [sys.executable, str(JOB), case, str(folder)], timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return [(folder / f"rank{r}.txt").read_text() for r in range(2)]


def test_a_shape_mismatch_raises_on_both_ranks_naming_what_each_passed(mpirun, tmp_path):
    lines = run_job(mpirun, tmp_path, "shape")
    message = ("CollectiveMismatchError: hpcrep.allreduce: ranks disagree on tensor 'w' "
               "(position 0 of 1): rank 0 passed float32[3]; rank 1 passed float32[4].")
    assert len(lines) == 2 and all(message in line for line in lines), lines
    assert [line[:7] for line in lines] == ["rank 0:", "rank 1:"]


def test_equal_signatures_agree_on_both_ranks_whatever_the_tensors_are_called(mpirun, tmp_path):
    assert run_job(mpirun, tmp_path, "renamed") == ["rank 0: agreed", "rank 1: agreed"]
    assert run_job(mpirun, tmp_path, "same") == ["rank 0: agreed", "rank 1: agreed"]
