"""Print this rank's local rank and CUDA_VISIBLE_DEVICES to stderr (for test_gpu_pinning).

``explicit``: call ``hvd.init()`` first, as a Horovod user does; ``plain``: nothing (under
``python -m hpcrep`` transparent mode has already run)."""

import os
import sys

if sys.argv[1:] == ["explicit"]:
    import hpcrep.tensorflow as hvd

    hvd.init()
local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "?"))
print(f"local_rank {local} sees {os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}",
      file=sys.stderr, flush=True)
