"""``mpirun -n N python -m jobs.d4pg [options]``: see :mod:`jobs.d4pg.train`."""

import sys

from jobs.d4pg.train import main

sys.exit(main())
