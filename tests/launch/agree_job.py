"""Run by tests/launch/test_mutation_gaps_agree.py on 2 ranks: each rank passes its own
signature to hpcrep.comm.check.agree and prints what happened, one line.

Usage: agree_job.py CASE, CASE one of: shape (rank r passes float32[3 + r]), renamed (the same
tensor under a name of each rank's own), same.
"""

import sys

from mpi4py import MPI

from hpcrep.comm import check
from hpcrep.errors import CollectiveMismatchError

rank = MPI.COMM_WORLD.Get_rank()
case = sys.argv[1]
entry = {"shape": ("w", "float32", (3 + rank,)), "renamed": (f"w{rank}", "float32", (3,)),
         "same": ("w", "float32", (3,))}[case]
try:
    check.agree(MPI.COMM_WORLD, ("allreduce", ("Sum",), (entry,)))
    print(f"rank {rank}: agreed", flush=True)
except CollectiveMismatchError as exc:
    print(f"rank {rank}: CollectiveMismatchError: {exc}", flush=True)
