"""Print one JSON line per rank: host name, world rank and size, hpcrep's topology, and whether
Open MPI was told to yield while waiting (``OMPI_MCA_mpi_yield_when_idle``, None if unset)."""

import json
import os
import socket

import hpcrep.comm as hc

hc.init()
print(json.dumps({"host": socket.gethostname(), "rank": hc.rank(), "size": hc.size(),
                  "local_rank": hc.local_rank(), "local_size": hc.local_size(),
                  "cross_rank": hc.cross_rank(), "cross_size": hc.cross_size(),
                  "yield": os.environ.get("OMPI_MCA_mpi_yield_when_idle")}), flush=True)
