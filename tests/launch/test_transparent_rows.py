"""tests/mpi/test_transparent_rows.py at 2 and 3 ranks (the MPI suite runs at 4 and 1): on
uneven input, ``evaluate`` and ``fit``'s validation give the one-process result, and ``fit``
trains every row of arrays once per epoch (other kinds: what is left out is warned with its
count). A failure on any rank fails the job."""

from __future__ import annotations

import re

import pytest

SUITE = "tests/mpi/test_transparent_rows.py"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", [2, 3])
def test_rows_suite_passes_at(mpirun, n):
    proc = mpirun.run(n, [mpirun.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", SUITE],
                      timeout=880, cwd=mpirun.root)
    assert proc.returncode == 0, f"{n} ranks:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    summaries = re.findall(rf"hpcrep MPI suite rank (\d+)/{n} on .*: (\d+) passed$", proc.stdout,
                           re.M)
    assert sorted(int(r) for r, _ in summaries) == list(range(n)), proc.stdout[-3000:]
    assert len({count for _, count in summaries}) == 1 and int(summaries[0][1]) >= 30, summaries
