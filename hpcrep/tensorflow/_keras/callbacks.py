"""Keras callbacks for data-parallel training: the implementation of Horovod's ``hvd.callbacks``
(:mod:`hpcrep.tensorflow.keras.callbacks`) and of transparent mode's broadcast and averaging."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Union

import keras
import numpy as np

from hpcrep import comm
from hpcrep.comm import timeline
from hpcrep.tensorflow.variables import broadcast_variables, variable_key


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Give every rank rank ``root_rank``'s weights and optimizer state, once, when training starts.

    A model that is already built is broadcast in ``on_train_begin``, with the optimizer built
    first so that its slots (momentum, Adam moments) are broadcast too and all ranks start bitwise
    identical. A model built lazily by its first batch (a ``Sequential`` without ``Input``, as in
    Horovod's Keras examples) has no weights then; it is broadcast at the end of the first batch,
    which is when Horovod broadcasts every model: the first step's update is averaged across
    ranks, and the broadcast then makes the weights equal. Place it first in the callback list.

    Args:
        root_rank: the rank whose values every rank receives.
        device: accepted for Horovod compatibility and ignored (hpcrep broadcasts on the host).
        local_variables: variables (or a layer's weights) that stay different on each rank and are
            not broadcast, e.g. those registered with ``register_local_var``.
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Optional[Iterable[Any]] = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.local_variables = {variable_key(v) for v in (local_variables or [])}
        self.broadcast_done = False

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        """Collective: runs on every rank at the start of ``fit``."""
        if not self.broadcast_done and self.model.built and self.model.variables:
            optimizer = self.model.optimizer
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        """Collective: runs on every rank after the first batch if the model was built lazily."""
        if not self.broadcast_done:
            self._broadcast()

    def _broadcast(self) -> None:
        variables = list(self.model.variables)
        optimizer = self.model.optimizer
        if optimizer is not None:
            variables += list(optimizer.variables)
        broadcast_variables([v for v in variables if variable_key(v) not in self.local_variables],
                            self.root_rank)
        self.broadcast_done = True


class TimelineCallback(keras.callbacks.Callback):
    """Mark each ``fit`` batch as a step of the timeline (``HPCREP_TIMELINE``,
    ``hvd.start_timeline``): the batch's start and end, data loading and callbacks included.
    Transparent mode adds it to every ``fit``; it does nothing while no timeline records.
    Local."""

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        timeline.step_begin("fit")

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        timeline.step_end("fit")


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


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between two epochs (Horovod's).

    ``multiplier`` is a function of the epoch, or a number ``m`` meaning ``m ** (epoch -
    start_epoch)`` (exponential decay). With ``staircase=True`` the rate changes at the first
    batch of each epoch in ``[start_epoch, end_epoch)``; otherwise at every batch, with the
    fractional epoch ``epoch + batch / steps_per_epoch``. Outside that range the rate is left as
    it is, so several of these callbacks can cover consecutive ranges.

    Args:
        initial_lr: the base rate; None reads the optimizer's rate when training starts.
        multiplier: ``fn(epoch) -> factor`` or a number (see above).
        start_epoch: first epoch (inclusive) the schedule applies to.
        end_epoch: last epoch (exclusive); None: no end.
        staircase: change once per epoch (True) or every batch (False).
        momentum_correction: accepted for Horovod compatibility and ignored: Keras 3 compiles an
            optimizer's momentum into the train step as a constant, so it cannot be rescaled per
            batch.
        steps_per_epoch: batches per epoch; needed with ``staircase=False`` unless ``fit`` knows it.
    """

    def __init__(self, initial_lr: Optional[float],
                 multiplier: Union[float, Callable[[float], float]], start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = float(np.asarray(self.model.optimizer.learning_rate))
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
            if not self.steps_per_epoch:
                raise ValueError(
                    "LearningRateScheduleCallback(staircase=False) needs steps_per_epoch: pass it, "
                    "or give fit() data of known length or steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self.model.optimizer.learning_rate = self._scheduled(self.current_epoch)
        else:
            epoch = self.current_epoch + float(batch) / self.steps_per_epoch
            self.model.optimizer.learning_rate = self._scheduled(epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))

    def rate_at(self, epoch: float) -> float:
        """Return the scheduled learning rate at (fractional) ``epoch``."""
        return self._scheduled(epoch)

    def _scheduled(self, epoch: float) -> float:
        return self.initial_lr * self.multiplier(epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over warm-up epochs.

    Follows Goyal et al. (2017) as Horovod does: at fractional epoch ``e`` the rate is
    ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)`` (:meth:`rate_at`), applied before
    each batch of the warm-up epochs at ``e = epoch + (batch + 1) / steps_per_epoch``, so that an
    epoch's last batch runs at a round value, as in Horovod; after warm-up the rate is left alone.
    ``initial_lr`` is the already-scaled rate (e.g. base rate x size). ``momentum_correction`` is
    accepted and ignored (see :class:`LearningRateScheduleCallback`).
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        super().__init__(initial_lr, self._multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = float(warmup_epochs)
        self.verbose = verbose

    def _multiplier(self, epoch: float) -> float:
        return self.rate_at(epoch + 1.0 / self.steps_per_epoch) / self.initial_lr

    def rate_at(self, epoch: float) -> float:
        """Return the warm-up learning rate at fractional ``epoch`` (capped at ``initial_lr``)."""
        n = comm.size()
        progress = min(epoch, self.warmup_epochs) / self.warmup_epochs if self.warmup_epochs else 1
        return self.initial_lr / n * (progress * (n - 1) + 1)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.verbose and comm.rank() == 0 and epoch + 1 == int(np.ceil(self.warmup_epochs)):
            print(f"\nEpoch {epoch + 1}: finished learning-rate warm-up to {self.initial_lr:g}.")
