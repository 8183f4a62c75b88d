"""An unchanged Horovod Keras script (see explicit_step.py): where Horovod is not installed,
``hpcrep run`` runs it with ``horovod.tensorflow.keras`` mapped to ``hpcrep.tensorflow.keras``."""

import horovod.tensorflow.keras as hvd
from explicit_step import main

main(hvd)
