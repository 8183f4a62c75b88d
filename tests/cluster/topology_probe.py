"""Print one JSON line per rank: host name, world rank and size, and hpcrep's topology."""

import json
import socket

import hpcrep.comm as hc

hc.init()
print(json.dumps({"host": socket.gethostname(), "rank": hc.rank(), "size": hc.size(),
                  "local_rank": hc.local_rank(), "local_size": hc.local_size(),
                  "cross_rank": hc.cross_rank(), "cross_size": hc.cross_size()}), flush=True)
