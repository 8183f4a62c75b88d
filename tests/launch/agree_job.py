"""Run by tests/launch/test_mutation_gaps_agree.py on 2 ranks: each rank passes its own
signature to hpcrep.comm.check.agree and writes what happened, one line, to OUT/rank<r>.txt
(a file per rank: lines that ranks print can interleave).

Usage: agree_job.py CASE OUT, CASE one of: shape (rank r passes float32[3 + r]), renamed (the same
tensor under a name of each rank's own), same.
"""

import sys
from pathlib import Path

from mpi4py import MPI

from hpcrep.comm import check
from hpcrep.errors import CollectiveMismatchError

rank = MPI.COMM_WORLD.Get_rank()
case, out = sys.argv[1], Path(sys.argv[2])
entry = {"shape": ("w", "float32", (3 + rank,)), "renamed": (f"w{rank}", "float32", (3,)),
         "same": ("w", "float32", (3,))}[case]
try:
    check.agree(MPI.COMM_WORLD, ("allreduce", ("Sum",), (entry,)))
    line = f"rank {rank}: agreed"
except CollectiveMismatchError as exc:
    line = f"rank {rank}: CollectiveMismatchError: {exc}"
(out / f"rank{rank}.txt").write_text(line)
