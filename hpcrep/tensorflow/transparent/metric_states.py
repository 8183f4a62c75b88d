"""``evaluate`` results combined exactly across ranks: the metrics' states are summed, not their
results averaged.

Each rank evaluates its own share of the input (uneven shares allowed: evaluation exchanges no
gradients). Keras's metrics keep additive states (a ``Mean`` keeps a total and a count, the loss
tracker a batch-size-weighted total and a count, ``AUC`` its confusion counts): summing every
metric variable across ranks before ``result()`` gives, on every rank, what one process
evaluating the whole input gets (to float rounding), however the rows were shared. A metric whose
state is not a sum (a custom maximum, say) would be combined wrongly; Keras's own are all sums.

The hook is Keras's ``Model._get_metrics_result_or_logs`` (Keras 3), which ``evaluate`` calls
once, after its loop and before its callbacks' ``on_test_end``: while :func:`combining` is active
on the calling thread, it first sums the states. A rank that evaluated a stand-in (its share was
empty, see :mod:`.predict_share`) zeroes its states first, so it contributes nothing.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import numpy as np

from hpcrep import comm
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class

_local = threading.local()


@contextlib.contextmanager
def combining(empty: Callable[[], bool]) -> Iterator[None]:
    """Sum the metric states across ranks when the ``evaluate`` run inside the body computes its
    result; ``empty()`` says (then) whether this rank's share was a stand-in to discard."""
    previous = getattr(_local, "empty", None)
    _local.empty = empty
    try:
        yield
    finally:
        _local.empty = previous


def sum_states(model: Any, empty: bool) -> None:
    """Replace every metric variable of ``model`` by its sum across ranks (zeroed first where
    ``empty``).

    Collective: every rank must call this, in the same order, for models with the same metrics.
    """
    if empty:
        model.reset_metrics()
    variables = [v for metric in model.metrics for v in metric.variables]
    if not variables or comm.size() == 1:
        return
    values = [np.asarray(v.numpy(), np.float64) for v in variables]
    flat = np.concatenate([v.ravel() for v in values]) if values else np.zeros(0)
    total = comm.allreduce(flat, comm.Sum, name="metric_states")
    offset = 0
    for variable, value in zip(variables, values):
        part = total[offset:offset + value.size].reshape(value.shape)
        variable.assign(part.astype(variable.dtype))
        offset += value.size


def install(patches: PatchSet) -> None:
    """Patch ``Model._get_metrics_result_or_logs`` to sum metric states inside
    :func:`combining`. Local."""
    import keras  # noqa: PLC0415 - keeps this module importable for its docs without Keras

    owner = defining_class(keras.Model, "_get_metrics_result_or_logs")
    original = vars(owner)["_get_metrics_result_or_logs"]

    def _get_metrics_result_or_logs(self: Any, logs: Any) -> Any:
        empty = getattr(_local, "empty", None)
        if empty is not None:
            _local.empty = None  # once per evaluate: a nested call is Keras's own
            try:
                sum_states(self, empty())
            finally:
                _local.empty = empty
        return original(self, logs)

    patches.attr(owner, "_get_metrics_result_or_logs", _get_metrics_result_or_logs)
