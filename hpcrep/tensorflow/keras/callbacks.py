"""Keras callbacks for data-parallel training (Horovod's ``hvd.callbacks``); the implementation
is in :mod:`hpcrep.tensorflow._keras`."""

from hpcrep.tensorflow._keras.backup_and_restore import BackupAndRestore
from hpcrep.tensorflow._keras.callbacks import (BroadcastGlobalVariablesCallback,
                                                LearningRateScheduleCallback,
                                                LearningRateWarmupCallback,
                                                MetricAverageCallback, TimelineCallback)
from hpcrep.tensorflow._keras.communication_board import CommunicationTensorBoard

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BackupAndRestore",
           "TimelineCallback", "CommunicationTensorBoard"]
