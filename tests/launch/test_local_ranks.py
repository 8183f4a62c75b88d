"""The mpirun command line hpcrep builds for the MPI installed here starts more ranks than the
machine has cores, each in a world of that size (Open MPI refuses without its oversubscription
flag, and as root without its root flag)."""

import os
import re

import pytest


@pytest.mark.timeout(120)
def test_more_ranks_than_cores_start_in_one_world(mpirun):
    n = max(4, (os.cpu_count() or 1) + 1)
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)")
    done = mpirun.run(n, [mpirun.python, "-c", code], timeout=90)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # mpirun forwards the ranks' output in chunks, not lines: two ranks' lines can arrive joined.
    seen = sorted(re.findall(r"rank (\d+) of (\d+)", done.stdout))
    assert seen == sorted((str(r), str(n)) for r in range(n)), done.stdout
