"""Run on 2 ranks by :mod:`hpcrep.launch.doctor.allreduce`: time a small and a large allreduce
and, on rank 0, a memcpy of the same size; rank 0 prints one JSON line.

mpi4py and numpy only. Collective: both ranks run it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(comm: MPI.Comm, nbytes: int) -> dict:
    """Return the job's size, hosts, small-allreduce latency (s), large-allreduce bandwidth
    (bytes/s) and rank 0's memcpy bandwidth (bytes/s). Collective: every rank must call this."""
    small, small_out = np.ones(1, np.float64), np.empty(1, np.float64)
    for _ in range(50):
        comm.Allreduce(small, small_out)
    rounds = 100

    def batch() -> None:
        comm.Barrier()
        for _ in range(rounds):
            comm.Allreduce(small, small_out)

    latency = _best(batch, 5) / rounds  # the best batch: other load on the cores only slows
    big = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(big)
    comm.Allreduce(big, out)
    ok = bool(out[0] == comm.Get_size())
    seconds = _best(lambda: (comm.Barrier(), comm.Allreduce(big, out)), 4)
    copy = _best(lambda: np.copyto(out, big), 4)
    hosts = comm.gather(socket.gethostname())
    return {"size": comm.Get_size(), "hosts": hosts, "latency": latency,
            "bandwidth": nbytes / seconds, "memcpy": nbytes / copy, "correct": ok,
            "bytes": nbytes, "load": os.getloadavg()[0], "cores": os.cpu_count() or 1}


if __name__ == "__main__":
    found = measure(MPI.COMM_WORLD, int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(found), flush=True)
