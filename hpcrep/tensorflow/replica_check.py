"""The replica canary: every ``HPCREP_CHECK_REPLICAS`` steps, check that the ranks still hold
the same weights.

A non-deterministic op, a per-rank update of the user's own, batch-norm statistics or a bug can
let replicas drift apart silently, and the saved model is rank 0's. The canary runs after the
optimizer's update (:func:`checks_replicas` wraps ``apply``: ``DistributedOptimizer``, the
Replicator's ``wrap_optimizer``, transparent mode, a ``LossScaleOptimizer`` that reduces first),
eagerly and inside ``tf.function``. A custom loop that reduces with ``DistributedGradientTape``
and applies with a plain optimizer calls :func:`check_replicas` itself: a tape has no step
count that every rank is sure to share (one counted per process drifts as soon as ranks make
different calls, as under ``join()``), so the canary does not count tapes.

Common path, no copy of the weights to the host: per variable a checksum (its bits read as
unsigned integers of the same width, summed with wrap-around: exact, and any single changed bit
shows; a permutation of the elements does not) and its float sum (not finite if the variable holds
NaN or inf), then ONE collective: a MAX allreduce of ``[c, ~c, nonfinite]`` (int64; ``~c`` is
``-c - 1``, so ``max(~c) = ~min(c)``: every rank learns at once whether ``max == min``).

Rare path, only when some checksum differs or some sum is not finite (every rank takes it, since
the decision comes from the allreduce): the ranks gather the checksums of the variables
concerned, broadcast rank 0's values of those that differ and measure max |x - x[rank 0]| on each
rank, and every rank prints the report (:mod:`.replica_report`) on its stderr. Then
``HPCREP_CHECK_REPLICAS_ACTION`` decides: ``warn``; ``abort`` raises
:class:`~hpcrep.errors.ReplicaDivergenceError` on every rank (inside ``tf.function`` it arrives
as ``tf.errors.UnknownError`` carrying that message); ``rebroadcast`` assigns rank 0's values of
every trainable and optimizer-state variable on every rank.

Non-trainable variables of a model the optimizer trains in transparent ``fit`` (or given to
:func:`check_replicas`), and variables registered as local, are checked too but reported as
information, once per set of differing variables, never as an error: local batch-norm
statistics differ by design. The check reads only: when everything agrees, nothing changes, and
with ``HPCREP_CHECK_REPLICAS=0`` nothing is added to a step at all.

The interval follows the optimizer's ``iterations`` after the update: a check when it is a
positive multiple of N (a step the loss scale skipped, or a pass that only accumulates gradients,
leaves it unchanged, so such a check may repeat: harmless, it only reads). The canary creates no
variable inside a traced step (that would make TensorFlow trace the user's step twice): its memory
of what it reported lives on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveArgumentError, ReplicaDivergenceError
from hpcrep.tensorflow import collectives
from hpcrep.tensorflow.bridge import host_call
from hpcrep.tensorflow.replica_report import (CHECKED, LOCAL, NON_TRAINABLE, OPTIMIZER, PREFIX,
                                              TRAINABLE, Entry, Findings, findings)
from hpcrep.tensorflow.variables import broadcast_variables, variable_key

_UNSIGNED = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}


def checksum(value: Any) -> tf.Tensor:
    """Return an int64 checksum of ``value``'s bits: its elements read as unsigned integers of
    their width and summed with wrap-around (16- and 8-bit elements summed as uint32).

    Equal on two ranks if the bits are equal; any single changed bit changes it. Local.
    """
    x = tf.convert_to_tensor(value)
    if x.dtype == tf.bool:
        x = tf.cast(x, tf.uint8)
    width = x.dtype.size
    if width not in _UNSIGNED or x.dtype.is_complex:
        raise CollectiveArgumentError(
            f"the replica check cannot checksum dtype {x.dtype.name}; check variables of "
            "integer, boolean or real floating dtypes")
    bits = x if x.dtype == _UNSIGNED[width] else tf.bitcast(x, _UNSIGNED[width])
    if width < 4:
        bits = tf.cast(bits, tf.uint32)
    total = tf.reduce_sum(bits)
    return tf.bitcast(total, tf.int64) if width == 8 else tf.cast(total, tf.int64)


def nonfinite(value: Any) -> tf.Tensor:
    """Return 1 (int64) if ``value``'s float sum is not finite, else 0: always 1 if it holds NaN
    or inf, and also if its finite values sum beyond the dtype's range (the rare path then looks
    at the elements themselves). Integers: 0. Local."""
    x = tf.convert_to_tensor(value)
    if not x.dtype.is_floating:
        return tf.constant(0, tf.int64)
    if x.dtype.size < 4:
        x = tf.cast(x, tf.float32)
    return tf.cast(tf.logical_not(tf.math.is_finite(tf.reduce_sum(x))), tf.int64)


def _label(variable: Any) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", "?"))


def _entries(trainable: Sequence[Any], optimizer: Any, extra: Sequence[Any],
             local: set) -> tuple[list[Any], list[Entry]]:
    """The variables to check and their entries: the trainable ones (registered local ones as
    ``local``), the optimizer's own, then ``extra`` non-trainable ones; each once."""
    seen: set = set()
    out: list[tuple[Any, Entry]] = []

    def add(variable: Any, kind: str) -> None:
        key = variable_key(variable)
        if key in seen:
            return
        seen.add(key)
        out.append((variable, Entry(_label(variable), kind)))

    for v in trainable:
        add(v, LOCAL if variable_key(v) in local else TRAINABLE)
    for v in (optimizer.variables if optimizer is not None else ()):
        add(v, OPTIMIZER)
    for v in extra:
        add(v, TRAINABLE if getattr(v, "trainable", False) else NON_TRAINABLE)
    return [v for v, _ in out], [e for _, e in out]


@dataclasses.dataclass
class _Site:
    """One place the canary runs (an optimizer): per set of checked
    variables, which meant-to-differ variables were last reported as differing.

    Kept on the host, not in a variable: a variable created while a ``tf.function`` traces its
    first call makes TensorFlow trace the user's step a second time. Every rank updates it from
    the same allreduced flags, so it is the same on every rank."""

    reported: dict = dataclasses.field(default_factory=dict)

    def should_show(self, entries: Sequence[Entry], meant_differing: frozenset) -> bool:
        """Whether to describe the meant-to-differ variables now (their set changed). Local."""
        key = tuple(entries)
        changed = self.reported.get(key, frozenset()) != meant_differing
        self.reported[key] = meant_differing
        return changed


_optimizer_sites: "weakref.WeakKeyDictionary[Any, _Site]" = weakref.WeakKeyDictionary()
_models: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_nesting = threading.local()


def watch_model(optimizer: Any, model: Any) -> None:
    """Also check ``model``'s non-trainable variables (as information) when ``optimizer``'s
    canary runs. Transparent ``fit`` calls this. Local."""
    _models[optimizer] = weakref.ref(model)


def checks_replicas(apply: Callable) -> Callable:
    """Decorate an optimizer's ``apply(grads, trainable_variables=None)`` so that the outermost
    call runs :func:`after_apply` once it has updated the variables (an optimizer applying
    through another's ``apply``, as ``LossScaleOptimizer`` does, is checked once). Local."""

    @functools.wraps(apply)
    def checked(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        depth = getattr(_nesting, "depth", 0)
        _nesting.depth = depth + 1
        try:
            result = apply(self, grads, trainable_variables)
        finally:
            _nesting.depth = depth
        if depth == 0:
            after_apply(self, trainable_variables)
        return result

    return checked


def after_apply(optimizer: Any, variables: Any = None) -> None:
    """Every ``HPCREP_CHECK_REPLICAS`` calls, check ``variables`` (default: those the optimizer
    was built on), the optimizer's state and the non-trainable variables of a watched model.

    Adds nothing when the setting is 0. Inside ``tf.function`` the check is a ``tf.cond`` on the
    optimizer's ``iterations``, so a compiled step checks on every N-th update.

    Collective: every rank of the optimizer's reducing communicator must call this, in the same
    order (ranks outside a ``process_set`` it reduces over skip it).
    """
    every = config.get("HPCREP_CHECK_REPLICAS")
    if every <= 0:
        return
    reducer = getattr(optimizer, "_hpcrep_reducer", None)
    process_set = getattr(reducer, "process_set", None)
    if isinstance(process_set, comm.ProcessSet) and not process_set.included():
        return
    trainable = list(variables) if variables is not None else list(
        getattr(optimizer, "_trainable_variables", ()))
    model_ref = _models.get(optimizer)
    model = model_ref() if model_ref is not None else None
    extra = list(model.non_trainable_variables) if model is not None else []
    checked, entries = _entries(trainable, optimizer, extra, getattr(reducer, "local", set()))
    site = _optimizer_sites.get(optimizer)
    if site is None:
        site = _optimizer_sites[optimizer] = _Site()
    # The optimizer's own step count after the update (no variable of the canary's: see
    # _Site). A step the loss scale skipped leaves it where it was, so the check at a multiple
    # of N may run again on such a step: harmless, it only reads.
    iterations = tf.convert_to_tensor(optimizer.iterations)
    due = tf.logical_and(iterations > 0, tf.equal(iterations % every, 0))
    tf.cond(due, lambda: _check(checked, entries, lambda: optimizer.iterations,
                                comm.resolve(process_set), site),
            lambda: tf.constant(False))


def _common_path(values: Sequence[tf.Tensor], communicator: comm.Communicator
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Return (this rank's checksums, this rank's nonfinite flags, whether each checksum differs
    across ranks, whether each sum is not finite on some rank): one MAX allreduce.

    Collective: every rank of ``communicator`` must call this, in the same order.
    """
    sums = tf.stack([checksum(x) for x in values])
    flags = tf.stack([nonfinite(x) for x in values])
    n = len(values)
    reduced = collectives.allreduce(tf.concat([sums, tf.bitwise.invert(sums), flags], 0),
                                    op=ReduceOp.Max, name="replica_check",
                                    process_set=communicator)
    differs = tf.not_equal(reduced[:n], tf.bitwise.invert(reduced[n:2 * n]))
    return sums, flags, differs, reduced[2 * n:] > 0


def _check(variables: Sequence[Any], entries: Sequence[Entry], step: Callable[[], Any],
           communicator: comm.Communicator, site: _Site) -> tf.Tensor:
    """One check of ``variables``; returns whether a trainable or optimizer variable differed.

    Collective: every rank of ``communicator`` must call this, in the same order.
    """
    action = config.get("HPCREP_CHECK_REPLICAS_ACTION")
    values = [tf.convert_to_tensor(v) for v in variables]
    sums, flags, differs, any_nonfinite = _common_path(values, communicator)
    is_checked = tf.constant([e.kind in CHECKED for e in entries])
    meant_now = tf.logical_and(differs, tf.logical_not(is_checked))
    diverged = tf.reduce_any(tf.logical_and(differs, is_checked))
    # Meant-to-differ variables (local batch-norm statistics) take the rare path whenever they
    # differ; the host then describes them only when their set changed (_Site.should_show).
    alarm = tf.reduce_any(tf.stack([diverged, tf.reduce_any(any_nonfinite),
                                    tf.reduce_any(meant_now)]))
    meant = [e.kind not in CHECKED for e in entries]

    def rare_path() -> tf.Tensor:
        def examine(step_v: np.ndarray, sums_v: np.ndarray, differs_v: np.ndarray,
                    nonfinite_v: np.ndarray, *arrays: np.ndarray) -> list:
            meant_differing = frozenset(i for i, d in enumerate(differs_v) if d and meant[i])
            show = site.should_show(entries, meant_differing)
            found = _examine(int(step_v), entries, sums_v, differs_v, nonfinite_v, arrays,
                             communicator, action, show)
            _act_on_host(found, action, int(step_v))
            return [np.array(found.diverged)]

        flag = host_call(examine, [tf.cast(step(), tf.int64), sums, differs, any_nonfinite,
                                   *values], [tf.bool], [tf.TensorShape([])],
                         name="hpcrep_replica_check")[0]
        if action == "rebroadcast":
            shared = [v for v, e in zip(variables, entries) if e.kind in CHECKED]
            return tf.cond(flag, lambda: _rebroadcast(shared, communicator),
                           lambda: tf.identity(flag))
        return tf.identity(flag)

    return tf.cond(alarm, rare_path, lambda: tf.constant(False))


def _rebroadcast(variables: Sequence[Any], communicator: comm.Communicator) -> tf.Tensor:
    with tf.control_dependencies([broadcast_variables(variables, 0, process_set=communicator)]):
        return tf.constant(True)


def _examine(step: int, entries: Sequence[Entry], sums: np.ndarray, differs: np.ndarray,
             nonfinite_hint: np.ndarray, values: Sequence[np.ndarray],
             communicator: comm.Communicator, action: str, show_meant: bool) -> Findings:
    """The rare path on the host: gather what each rank holds of the variables concerned and
    return the findings (the same on every rank).

    Collective: every rank of ``communicator`` must call this, in the same order, with the same
    ``differs``, ``nonfinite_hint`` and ``show_meant`` (they come from the allreduce).
    """
    meant = [e.kind not in CHECKED for e in entries]
    concerned = [i for i in range(len(entries))
                 if nonfinite_hint[i] or (differs[i] and (show_meant or not meant[i]))]
    measured = [i for i in concerned if differs[i]]
    mine = [(int(sums[i]), _holds_nonfinite(values[i])) for i in concerned]
    everyone = comm.allgather_object(mine, communicator)
    root_values = comm.grouped_broadcast([np.asarray(values[i]) for i in measured], 0,
                                         name="replica_check", communicator=communicator) \
        if measured else []
    distance = [_max_abs_difference(values[i], x0) for i, x0 in zip(measured, root_values)]
    distances = comm.allgather_object(distance, communicator) if measured else []
    sums_by = {i: [rank[k][0] for rank in everyone] for k, i in enumerate(concerned)}
    bad_by = {i: [rank[k][1] for rank in everyone] for k, i in enumerate(concerned)}
    magnitudes = {i: [rank[k] for rank in distances] for k, i in enumerate(measured)}
    return findings(step, entries, [bool(d) for d in differs], sums_by, magnitudes,
                    {i: flags for i, flags in bad_by.items() if any(flags)},
                    list(communicator.ranks), action, show_meant)


def _holds_nonfinite(value: Any) -> bool:
    a = np.asarray(value)
    if a.dtype.kind in "iub":
        return False
    if a.dtype.kind != "f":  # bfloat16 and other ml_dtypes types
        a = a.astype(np.float64)
    return not bool(np.all(np.isfinite(a)))


def _max_abs_difference(x: np.ndarray, x0: np.ndarray) -> float:
    a, b = np.asarray(x, np.float64), np.asarray(x0, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _act_on_host(found: Findings, action: str, step: int) -> None:
    """Print ``found`` on this rank's stderr; raise for ``abort``; say so for ``rebroadcast``."""
    lines = list(found.lines)
    if found.diverged and action == "rebroadcast":
        lines.append(f"{PREFIX}, step {step}: rebroadcasting rank 0's values of the trainable "
                     "and optimizer state variables to every rank")
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    if found.diverged and action == "abort":
        raise ReplicaDivergenceError(
            "replicas diverged (HPCREP_CHECK_REPLICAS_ACTION=abort): " + " | ".join(found.lines)
            + ". Look for per-rank updates or non-deterministic ops; "
            "HPCREP_CHECK_REPLICAS_ACTION=rebroadcast restores rank 0's values instead.")


@dataclasses.dataclass(frozen=True)
class ReplicaCheckResult:
    """What :func:`check_replicas` found (the same on every rank).

    Attributes:
        agree: True if every trainable and optimizer-state variable is bitwise equal on every
            rank (non-trainable differences and NaN/inf do not count against it).
        differing: names of trainable or optimizer-state variables that differ.
        meant_to_differ: names of non-trainable variables that differ (information).
        nonfinite: names of variables holding NaN or inf on some rank.
        lines: the report (empty when everything agrees and is finite).
    """

    agree: bool
    differing: tuple[str, ...] = ()
    meant_to_differ: tuple[str, ...] = ()
    nonfinite: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()


def check_replicas(variables_or_model: Any, optimizer: Any = None, process_set: Any = None,
                   action: Optional[str] = None) -> ReplicaCheckResult:
    """Check now that every rank holds the same ``variables_or_model`` (a Keras model, or a list
    of variables) and ``optimizer`` state; return what was found.

    A model's non-trainable variables (and listed variables that are not trainable) are
    reported as information, not counted as a difference. ``action``: None only returns the
    result; ``"warn"`` also prints the report on stderr; ``"abort"`` raises; ``"rebroadcast"``
    assigns rank 0's values of the trainable and optimizer variables on every rank. Eager only.

    Collective: every rank of ``process_set`` must call this, in the same order.

    Raises:
        CollectiveArgumentError: called inside ``tf.function``, or an unknown ``action``.
        ReplicaDivergenceError: ``action="abort"`` and some variable differs (on every rank).
    """
    if not tf.executing_eagerly():
        raise CollectiveArgumentError(
            "check_replicas runs eagerly (it returns a Python result); call it outside "
            "tf.function, or let HPCREP_CHECK_REPLICAS check inside the step")
    if action not in (None, "warn", "abort", "rebroadcast"):
        raise CollectiveArgumentError(
            f"action must be None, 'warn', 'abort' or 'rebroadcast'; got {action!r}")
    if hasattr(variables_or_model, "trainable_variables") and hasattr(
            variables_or_model, "non_trainable_variables"):
        trainable = list(variables_or_model.trainable_variables)
        extra = list(variables_or_model.non_trainable_variables)
    else:
        listed = list(variables_or_model)
        trainable = [v for v in listed if getattr(v, "trainable", True)]
        extra = [v for v in listed if not getattr(v, "trainable", True)]
    variables, entries = _entries(trainable, optimizer, extra, set())
    communicator = comm.resolve(process_set)
    values = [tf.convert_to_tensor(v) for v in variables]
    sums, _, differs, any_nonfinite = _common_path(values, communicator)
    differs_v, nonfinite_v = differs.numpy(), any_nonfinite.numpy()
    if not (differs_v.any() or nonfinite_v.any()):
        return ReplicaCheckResult(agree=True)
    step = int(optimizer.iterations.numpy()) if optimizer is not None else 0
    found = _examine(step, entries, sums.numpy(), differs_v, nonfinite_v,
                     [x.numpy() for x in values], communicator, action or "none", True)
    if action is not None:
        _act_on_host(found, action, step)
    if found.diverged and action == "rebroadcast":
        broadcast_variables([v for v, e in zip(variables, entries) if e.kind in CHECKED], 0,
                            process_set=communicator)
    return ReplicaCheckResult(agree=not found.diverged, differing=found.differing,
                              meant_to_differ=found.meant_to_differ,
                              nonfinite=found.nonfinite, lines=found.lines)
