"""Horovod's Keras elastic face (``hvd.elastic`` of ``horovod.tensorflow.keras``): a Keras state
and the callbacks that keep it current. What elastic mode does and does not do without a driver:
:mod:`hpcrep.tensorflow.elastic`; the implementation: :mod:`hpcrep.tensorflow._keras.elastic`."""

from hpcrep.tensorflow._keras.elastic import (CommitStateCallback, KerasState,
                                              TensorFlowKerasState, UpdateBatchStateCallback,
                                              UpdateEpochStateCallback)
from hpcrep.tensorflow.elastic.state import ObjectState, run

__all__ = ["KerasState", "TensorFlowKerasState", "ObjectState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
