"""Horovod-compatible Keras face: ``import hpcrep.tensorflow.keras as hvd``.

The names of ``horovod.tensorflow.keras``: all of :mod:`hpcrep.tensorflow`, plus ``callbacks``,
the Keras ``elastic``, ``PartialDistributedOptimizer`` and ``load_model``. The Keras-specific
implementation is in :mod:`hpcrep.tensorflow._keras`.
"""

from hpcrep.tensorflow import *  # noqa: F403 - same names as horovod.tensorflow.keras
from hpcrep.tensorflow import __all__ as _base_all
# Imported as a submodule: ``from ... import elastic`` would keep hpcrep.tensorflow's, which the
# star import above already bound here.
import hpcrep.tensorflow.keras.elastic as elastic  # noqa: F401 - replaces hpcrep.tensorflow's
from hpcrep.tensorflow._keras.load_model import load_model
from hpcrep.tensorflow.keras import callbacks
from hpcrep.tensorflow.optimizer import PartialDistributedOptimizer

__all__ = list(_base_all) + ["callbacks", "PartialDistributedOptimizer", "load_model"]
