"""Keras callbacks for data-parallel training (Horovod's ``hvd.callbacks``)."""

from __future__ import annotations

from typing import Any, Optional

import keras
import numpy as np

from hpcrep import comm
from hpcrep.tensorflow.backup_and_restore import BackupAndRestore  # noqa: F401 - hvd.callbacks
from hpcrep.tensorflow.variables import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank rank ``root_rank``'s weights and optimizer state.

    The optimizer is built first, so its slots (momentum, Adam moments) are broadcast too and all
    ranks start bitwise identical. Place it first in the callback list.
    """

    def __init__(self, root_rank: int = 0, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        """Collective: runs on every rank at the start of ``fit``."""
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        variables = list(self.model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the metrics in ``logs`` across ranks at the end of every epoch.

    Place it before callbacks that read the metrics (checkpointing, early stopping, loggers).
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        """Collective: runs on every rank at the end of each epoch."""
        average_logs(logs)


def average_logs(logs: Optional[dict]) -> None:
    """Replace each numeric entry of ``logs`` with its average across ranks, in place.

    Collective: every rank must call this with logs holding the same keys.
    """
    if not logs or comm.size() == 1:
        return
    keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and _is_number(v))
    if not keys:
        return
    values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
    averaged = comm.allreduce(values, comm.Average, name="metrics")
    for k, v in zip(keys, averaged):
        logs[k] = float(v)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over warm-up epochs.

    Follows Goyal et al. (2017) as Horovod does: at fractional epoch ``e`` the rate is
    ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)``; after warm-up it is left alone.
    ``initial_lr`` is the already-scaled rate (e.g. base rate x size).
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch: pass it, or give "
                             "fit() data of known length / steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        if epoch > self.warmup_epochs:
            return
        self.model.optimizer.learning_rate = self.rate_at(epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))
        if self.verbose and comm.rank() == 0 and epoch + 1 == int(np.ceil(self.warmup_epochs)):
            print(f"\nEpoch {epoch + 1}: finished learning-rate warm-up to {self.initial_lr:g}.")

    def rate_at(self, epoch: float) -> float:
        """Return the warm-up learning rate at fractional ``epoch``."""
        n = comm.size()
        progress = min(epoch, self.warmup_epochs) / self.warmup_epochs if self.warmup_epochs else 1
        return self.initial_lr / n * (progress * (n - 1) + 1)
