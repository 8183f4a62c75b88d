"""A finalize that cannot complete (run by test_ulfm_shrink.py, 2 ranks, Open MPI 5): rank 1
never finalizes and, WAIT seconds later, writes whether rank 0 is still alive; rank 0 writes its
pid and calls ``hpcrep.comm.ulfm.finalize(timeout=1)``, which must end it although rank 1 keeps
its ``MPI_Finalize`` from returning.

    python ulfm_finalize_job.py OUT_DIR WAIT
"""

from __future__ import annotations

import json
import os
import sys
import time

from mpi4py import MPI

from hpcrep.comm import ulfm


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    out, wait = sys.argv[1], float(sys.argv[2])
    comm = MPI.COMM_WORLD
    pid0 = comm.bcast(os.getpid(), root=0)
    if comm.Get_rank() == 0:
        with open(os.path.join(out, "finalizing"), "w") as f:
            f.write(repr(time.time()))
        ulfm.finalize(timeout=1.0)
        return 0
    time.sleep(wait)
    with open(os.path.join(out, "rank1.json"), "w") as f:
        json.dump({"rank0_alive_after_wait": alive(pid0), "checked": time.time()}, f)
    os._exit(0)  # never finalizes: rank 0's MPI_Finalize would wait for it


if __name__ == "__main__":
    sys.exit(main())
