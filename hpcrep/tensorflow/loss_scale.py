"""Mixed precision across ranks: every rank applies or skips the same step.

Keras's ``LossScaleOptimizer`` (which ``compile`` adds under the ``mixed_float16`` policy) checks
its gradients for inf/NaN and, where one is found, skips the step and halves the loss scale. On
local gradients that decision differs between ranks whenever one rank overflows and another does
not (normal early in mixed-precision training): the overflowing rank skips its inner optimizer's
``apply`` and with it the gradient exchange, while the others wait in that exchange, a hang.

hpcrep reduces the (scaled) gradients *before* the check. A non-finite value on any rank makes
the averaged gradient non-finite on every rank, so every rank takes the same branch, skips or
applies together, and keeps the same loss scale and step counter; no collective is added, the
exchange only moves before the check. Averaging commutes with Keras's unscaling (a division by
the same scale on every rank) up to rounding, which every rank shares.

How: :func:`install` (called by ``hvd.init()``) wraps ``LossScaleOptimizer.apply`` once. The
wrapper reduces with the gradient reducer of whoever would have reduced inside the inner
optimizer: a :func:`~hpcrep.tensorflow.DistributedOptimizer` given as the inner optimizer (the
order ``compile`` produces from ``compile(optimizer=hvd.DistributedOptimizer(...))``), or
transparent mode's reducer while it is active. It then runs Keras's ``apply`` inside
:func:`~hpcrep.tensorflow.gradients.reduced_scope`, in which the inner optimizer applies the
gradients as they are. A loss-scale optimizer with neither passes straight through, and so does
``hvd.DistributedOptimizer(LossScaleOptimizer(...))``, which reduces before Keras's ``apply``
itself. :func:`uninstall` (``hvd.shutdown()``) restores Keras's method.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import keras

from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow.gradients import GradientReducer, in_reduced_scope, reduced_scope
from hpcrep.tensorflow.optimizer import is_distributed
from hpcrep.tensorflow.replica_check import checks_replicas
from hpcrep.tensorflow.timeline import mark_step

# Transparent mode's reducer while it is active (set and restored through its PatchSet).
transparent_reducer: Optional[GradientReducer] = None

_original_apply: Optional[Callable[..., Any]] = None


def reducer_for(optimizer: Any) -> Optional[GradientReducer]:
    """Return the reducer that should average ``optimizer``'s gradients before its finiteness
    check, or None if none should (nothing distributed inside it). Local.

    Raises:
        CollectiveArgumentError: the inner optimizer accumulates gradients over several
            backward passes, which cannot be reduced before a per-pass check.
    """
    inner = optimizer.inner_optimizer
    if is_distributed(inner):
        if inner._hpcrep_passes != 1:
            raise CollectiveArgumentError(
                f"LossScaleOptimizer wraps {inner.name}, a DistributedOptimizer with "
                f"backward_passes_per_step={inner._hpcrep_passes}: its gradients are summed "
                "over passes before they are exchanged, so they cannot be averaged across ranks "
                "before the loss-scale check of each pass. Wrap the other way round: "
                "hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt), "
                f"backward_passes_per_step={inner._hpcrep_passes}).")
        return inner._hpcrep_reducer
    return transparent_reducer


def _apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
    """``LossScaleOptimizer.apply`` with gradients averaged across ranks before the check.

    Collective when a reducer applies (see :func:`reducer_for`): every rank must call this, in
    the same order, with matching gradients.
    """
    assert _original_apply is not None
    if in_reduced_scope() or reducer_for(self) is None:
        return _original_apply(self, grads, trainable_variables)
    return _reduce_then_apply(self, grads, trainable_variables)


@checks_replicas  # the replica canary runs here, once, not in the inner optimizer's apply
def _reduce_then_apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
    assert _original_apply is not None
    reducer = reducer_for(self)
    assert reducer is not None
    grads = list(grads)
    variables = None if trainable_variables is None else list(trainable_variables)
    reducer.build_before_reducing(self, variables)  # a stateful compression's state first
    sources = variables if variables is not None else (
        list(self._trainable_variables) if self.built else None)
    reduced = reducer.reduce(grads, sources)
    with reduced_scope():
        applied = _original_apply(self, reduced, variables)
    # The timeline's step boundary (when it records): the inner apply, in reduced_scope, does
    # not mark it, as the DistributedOptimizer that reduced would have.
    mark_step("apply", "end", after=[reduced, self.iterations])
    return applied


def install() -> None:
    """Wrap ``keras.optimizers.LossScaleOptimizer.apply`` (once; again is a no-op). Local."""
    global _original_apply
    if _original_apply is not None:
        return
    owner = keras.optimizers.LossScaleOptimizer
    _original_apply = vars(owner)["apply"]
    owner.apply = functools.wraps(_original_apply)(_apply)


def uninstall() -> None:
    """Restore Keras's ``LossScaleOptimizer.apply`` (a no-op if not installed). Local."""
    global _original_apply
    if _original_apply is None:
        return
    keras.optimizers.LossScaleOptimizer.apply = _original_apply
    _original_apply = None


def installed() -> bool:
    """Return True while ``LossScaleOptimizer.apply`` reduces before its check."""
    return _original_apply is not None
