"""A job in which one rank never enters a collective: the stall watchdog must end it.

    stall_job.py PIDS MISSING

Every rank writes its pid to ``PIDS.<rank>`` once all ranks have started; then rank ``MISSING``
sleeps (alive, outside MPI) while the others enter an allreduce of the tensor 'stuck.grad'.
Run with a short ``HPCREP_STALL_TIMEOUT``. numpy only: no TensorFlow start-up.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import hpcrep.comm as hc


def main() -> int:
    pids, missing = sys.argv[1], int(sys.argv[2])
    hc.init()
    hc.barrier()
    with open(f"{pids}.{hc.rank()}", "w") as f:
        f.write(f"{os.getpid()}\n")
    if hc.rank() == missing:
        time.sleep(600)  # never arrives; the job must not wait for it
    else:
        hc.allreduce(np.ones(4), hc.Sum, name="stuck.grad")
    print(f"rank {hc.rank()}: the allreduce returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
