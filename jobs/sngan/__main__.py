"""``mpirun -n N python -m jobs.sngan [options]``: see :mod:`jobs.sngan.train`."""

import sys

from jobs.sngan.train import main

sys.exit(main())
