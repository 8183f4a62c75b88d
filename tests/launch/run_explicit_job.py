"""A script written against hpcrep's Horovod-compatible Keras API (see explicit_step.py):
``hpcrep run`` must run it as it is, not in transparent mode."""

import hpcrep.tensorflow.keras as hvd
from explicit_step import main

main(hvd)
