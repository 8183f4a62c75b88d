"""Elastic state of a Keras model and the callbacks that keep it current (the implementation
behind ``hpcrep.tensorflow.elastic.TensorFlowKerasState`` and the Keras face's ``hvd.elastic``).
What elastic mode does and does not do without a driver: :mod:`hpcrep.tensorflow.elastic`."""

from __future__ import annotations

from typing import Any, Optional

import keras

from hpcrep.tensorflow.elastic.state import State, TensorFlowState


class TensorFlowKerasState(TensorFlowState):
    """A Keras model's and optimizer's variables plus plain attributes (``epoch``, ``batch``).

    Args:
        model: the Keras model.
        optimizer: its optimizer (default ``model.optimizer``); its slots count once built.
        backend: accepted for Horovod compatibility.
        **kwargs: plain attributes, as for :class:`ObjectState`.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(**kwargs)

    def restore(self) -> None:
        if len(self._values) > len(self.model.variables):
            self._build_optimizer()  # its slots are in the snapshot
        super().restore()

    def sync(self) -> None:
        """Build the optimizer of a built model (so every rank syncs the same variables), then
        give every rank rank 0's state and snapshot it. Collective."""
        self._build_optimizer()
        super().sync()

    def _build_optimizer(self) -> None:
        optimizer = self.optimizer
        if optimizer is not None and not optimizer.built and self.model.built \
                and self.model.trainable_variables:
            optimizer.build(self.model.trainable_variables)

    def variables(self) -> list[Any]:
        found = list(self.model.variables)
        if self.optimizer is not None and getattr(self.optimizer, "built", False):
            found += list(self.optimizer.variables)
        return found


class KerasState(TensorFlowKerasState):
    """:class:`TensorFlowKerasState` with Keras's backend (Horovod's ``hvd.elastic.KerasState``)."""

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


__all__ = ["TensorFlowKerasState", "KerasState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
