"""Learning rates multiplied by the number of ranks, kept out of saved files.

Transparent mode with ``HPCREP_TRANSPARENT_SCALE_LR`` multiplies an optimizer's learning rate by
the number of ranks when the optimizer first applies gradients (:func:`scale_learning_rate`).
Keras keeps a constant rate in an optimizer variable, so every saved file (weights files,
``BackupAndRestore`` backups, hpcrep checkpoints) would hold the *scaled* rate, and a run resumed
on another number of ranks (or resumed at all: the rate is scaled again at its first step) would
train at the wrong rate. So savers write inside :func:`unscaled` (the file holds the rate the
script asked for) and loaders call :func:`rescale_after_load` (an optimizer already scaled in
this process gets its factor back). A resumed run therefore trains at ``base x ranks now``.

Dividing by a factor that is not a power of two may change the last bit of the saved rate.
An optimizer that wraps another (``LossScaleOptimizer``, which transparent mode reaches only through
its inner optimizer) is saved with the variables of the one it wraps: :func:`unscaled` and
:func:`rescale_after_load` act on every scaled rate among ``optimizer.variables``.
Schedules are not variables: :class:`ScaledSchedule` wraps them and nothing is saved.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

_factors: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()


class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule multiplied by a constant (the number of ranks)."""

    def __init__(self, schedule: Any, factor: float) -> None:
        self.schedule = schedule
        self.factor = float(factor)

    def __call__(self, step: Any) -> Any:
        return self.schedule(step) * self.factor

    def get_config(self) -> dict:
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "factor": self.factor}


def _rate_variable(optimizer: Any) -> Optional[Any]:
    """The variable holding ``optimizer``'s constant learning rate, or None for a schedule."""
    current = getattr(optimizer, "_learning_rate", None)
    if current is None or isinstance(current, keras.optimizers.schedules.LearningRateSchedule):
        return None
    return current


def scale_learning_rate(optimizer: Any, factor: float) -> None:
    """Multiply ``optimizer``'s learning rate (a value or a schedule) by ``factor``. Local."""
    with tf.init_scope():
        variable = _rate_variable(optimizer)
        if variable is None:
            optimizer._learning_rate = ScaledSchedule(optimizer._learning_rate, factor)
        else:
            variable.assign(variable * factor)
            _factors[optimizer] = float(factor)


def factor(optimizer: Any) -> float:
    """Return the factor this process multiplied ``optimizer``'s rate variable by (1: none)."""
    return _factors.get(optimizer, 1.0) if optimizer is not None else 1.0


def _scaled_rates(optimizer: Any) -> list[tuple[Any, float]]:
    """``(rate variable, factor)`` for each rate this process scaled that ``optimizer`` saves:
    its own, or a wrapped optimizer's (those its ``variables`` include)."""
    if optimizer is None or not _factors:
        return []
    saved = {id(v) for v in getattr(optimizer, "variables", ())}
    found = []
    for scaled, f in list(_factors.items()):
        variable = _rate_variable(scaled)
        if variable is not None and id(variable) in saved:
            found.append((variable, f))
    return found


@contextlib.contextmanager
def unscaled(optimizer: Any) -> Iterator[None]:
    """While the body runs (a save), the rate variables among ``optimizer``'s variables hold the
    unscaled rates; afterwards they hold exactly the scaled values again. Local; a no-op for
    unscaled optimizers."""
    rates = _scaled_rates(optimizer)
    if not rates:
        yield
        return
    with tf.init_scope():
        scaled = [variable.numpy() for variable, _ in rates]
        for (variable, f), value in zip(rates, scaled):
            variable.assign(value / f)
    try:
        yield
    finally:
        with tf.init_scope():
            for (variable, _), value in zip(rates, scaled):
                variable.assign(value)


def unscaled_values(optimizer: Any, variables: Sequence[Any], values: list) -> list:
    """Return ``values`` (copies of ``variables``, numpy arrays) with each rate this process
    scaled among ``optimizer``'s variables divided back by its factor: what :func:`unscaled`
    would have let a saver read, without reading the variables again. ``values`` itself where
    nothing was scaled. Local."""
    factors = {id(variable): f for variable, f in _scaled_rates(optimizer)}
    if not factors:
        return values
    return [np.asarray(value / factors[id(variable)], dtype=value.dtype)
            if id(variable) in factors else value for variable, value in zip(variables, values)]


def rescale_after_load(optimizer: Any) -> None:
    """After a load wrote unscaled rates into ``optimizer``'s variables, apply each factor
    again. Local."""
    rates = _scaled_rates(optimizer)
    if rates:
        with tf.init_scope():
            for variable, f in rates:
                variable.assign(variable * f)


def follow_size(optimizer: Any, ratio: float) -> None:
    """Multiply the rates this process scaled among ``optimizer``'s (a rate variable or a
    :class:`ScaledSchedule`) by ``ratio``, and their factors with them: after the job shrank
    from N to M ranks (``ratio`` M / N) the rate follows the new size. Local; a no-op for
    unscaled optimizers."""
    if optimizer is None:
        return
    with tf.init_scope():
        for scaled, f in list(_factors.items()):
            variable = _rate_variable(scaled)
            if variable is not None and any(variable is v for v in optimizer.variables):
                variable.assign(variable * ratio)
                _factors[scaled] = f * ratio
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        schedule = getattr(candidate, "_learning_rate", None)
        if isinstance(schedule, ScaledSchedule):
            schedule.factor *= ratio
