"""Horovod's Keras elastic face (``hvd.elastic`` of ``horovod.tensorflow.keras``): a Keras state
and the callbacks that keep it current. See :mod:`hpcrep.tensorflow.elastic` for what elastic
mode does and does not do without a driver."""

from __future__ import annotations

from typing import Any, Optional

import keras

from hpcrep.tensorflow.elastic import ObjectState, State, TensorFlowKerasState, run


class KerasState(TensorFlowKerasState):
    """:class:`~hpcrep.tensorflow.elastic.TensorFlowKerasState` with Keras's backend (Horovod's)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches, at the end of the batch. Local."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch of the epoch (0 after an epoch). Local."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the next epoch to run, counted from the state's epoch when
    training began (pass ``initial_epoch=state.epoch`` to ``fit``), as Horovod does. Local."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "TensorFlowKerasState", "ObjectState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
