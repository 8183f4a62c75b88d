"""``mpirun -n N python -m jobs.resnet [options]``: see :mod:`jobs.resnet.train`."""

import sys

from jobs.resnet.train import main

sys.exit(main())
