"""Print, on rank 0, every rank's OMPI_MCA_mpi_yield_when_idle (None: not set) as seen after
MPI started: tests/launch/test_hpcrep_run.py checks hpcrep's yield policy with it."""

import json
import os

import hpcrep.comm as hc

hc.init()
values = hc.allgather_object(os.environ.get("OMPI_MCA_mpi_yield_when_idle"))
if hc.rank() == 0:
    print("yield " + json.dumps({"local_size": hc.local_size(), "values": values}), flush=True)
