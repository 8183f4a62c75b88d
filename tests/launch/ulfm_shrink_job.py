"""A numpy allreduce loop whose ranks go on when one of them is SIGKILLed (ULFM).

    ulfm_shrink_job.py OUT STEPS VICTIM KILL_AT

Run under Open MPI 5's ``mpirun --with-ft ulfm`` from ``.venv-ulfm``. Every step allreduces
``rank + 1`` (old rank, 64 KiB of float64) and checks the sum against the ranks alive. Rank
``VICTIM`` writes the time to ``OUT/death`` and SIGKILLs itself before its step ``KILL_AT``; the
others see the failure in their allreduce, :func:`hpcrep.comm.ulfm.shrink` their communicator,
resume from the step the survivors agree on, and run to ``STEPS``. Each survivor writes
``OUT/rank<R>.json``: what it found, and when its first good allreduce after the failure ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrep.comm import ulfm


def main() -> int:
    out, steps, victim, kill_at = sys.argv[1], *map(int, sys.argv[2:5])
    comm = MPI.COMM_WORLD.Dup()
    me = comm.Get_rank()
    alive = list(range(comm.Get_size()))
    x = np.full(8192, me + 1, dtype=np.float64)
    total = np.empty_like(x)
    wrong, shrinks, first_good = [], [], None
    step = 0
    while step < steps:
        if me == victim and step == kill_at:
            with open(os.path.join(out, "death"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.Allreduce(x, total, op=MPI.SUM)
        except MPI.Exception as exc:
            if not ulfm.is_failure(exc):
                raise
            shrunk = ulfm.shrink(comm, step)
            comm, step, alive = shrunk.comm, shrunk.step, list(shrunk.survivors)
            shrinks.append({"lost": list(shrunk.lost), "step": shrunk.step,
                            "seconds": shrunk.seconds,
                            "error_class": exc.Get_error_class()})
            continue
        if shrinks and first_good is None:
            first_good = time.time()
        expected = sum(r + 1 for r in alive)
        if not np.all(total == expected):
            wrong.append([step, float(total[0]), expected])
        step += 1
    result = {"rank": me, "size": comm.Get_size(), "steps": step, "wrong": wrong,
              "shrinks": shrinks, "first_good": first_good, "has_ulfm": ulfm.has_ulfm(),
              "library": MPI.Get_library_version().splitlines()[0].strip()}
    with open(os.path.join(out, f"rank{me}.json"), "w") as f:
        json.dump(result, f)
    ulfm.finalize()  # MPI.Finalize (implicit or not) can hang for good after a shrink
    return 0


if __name__ == "__main__":
    sys.exit(main())
