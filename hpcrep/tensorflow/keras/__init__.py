"""Horovod-compatible Keras face: ``import hpcrep.tensorflow.keras as hvd``."""

from hpcrep.tensorflow import *  # noqa: F403 - same names as horovod.tensorflow.keras
from hpcrep.tensorflow import __all__ as _base_all
import hpcrep.tensorflow.keras.elastic as elastic  # noqa: F401 - replaces hpcrep.tensorflow's
from hpcrep.tensorflow.keras import callbacks
from hpcrep.tensorflow.optimizer import PartialDistributedOptimizer

__all__ = list(_base_all) + ["callbacks", "PartialDistributedOptimizer"]
