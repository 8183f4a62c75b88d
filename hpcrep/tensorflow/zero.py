"""ZeRO stage 1: optimizer state sharded across ranks (``shard_optimizer_state=True``).

Every rank keeps the whole model, but only ``1/size`` of the optimizer's state. The trainable
variables are laid out one after another in one flat vector (:class:`~hpcrep.tensorflow.
zero_layout.FlatLayout`, the optimizer's build order, the same on every rank) cut into ``size``
equal slices. Each rank holds its slice of the parameters as one variable and an *inner* copy of
the user's optimizer built on that one variable, so Adam's two slots take ``2 * total / size``
elements per rank instead of ``2 * total``. One step
(:meth:`~hpcrep.tensorflow.zero_step.ShardedState.apply`):

1. the gradients, flattened in that order, are reduce-scattered (averaged) across the ranks:
   each rank receives the averaged gradient of its slice only;
2. the slice of the parameters is read from the model's variables, and the inner optimizer
   updates it with its slots (global-norm clipping: one extra allreduce of the squared norm);
3. the updated slices are allgathered and written back into the model's variables. Every
   element is computed on exactly one rank, so every rank ends the step bitwise equal.

A reduce-scatter and an allgather together move about what one allreduce moves: ZeRO-1 saves
memory (the slots), not traffic. Both go through the host path (``hpcrep.comm``), one call each.

The result equals the unsharded optimizer up to the order of the gradient sum, because the
optimizers allowed (:data:`SHARDABLE`) update each element from that element's gradient and slots
only. What would differ is refused with :class:`~hpcrep.errors.ShardedStateError` on every rank
(checked before anything is communicated): other optimizer classes, ``clipnorm`` (a norm per
variable), ``use_ema``, ``gradient_accumulation_steps``, Adasum, process sets,
``backward_passes_per_step > 1``, local variables, and a step that has no gradient for some
variable. Weight decay with per-variable exclusions (AdamW's ``exclude_from_weight_decay``) is
applied here with a mask, with Keras's arithmetic. The step counter and learning rate stay the
wrapper's own variables (``optimizer.variables``, equal on every rank); the inner copy reads them.

Checkpoints hold the *unsharded* layout (:func:`state_arrays`, :func:`assign_state`): the slots
are gathered to full shape in the order a plain optimizer holds them, so a checkpoint restores
with or without sharding and at any number of ranks. ``hpcrep.checkpoint``'s helpers
(``training_state``, ``CheckpointCallback``, transparent mode's ``HPCREP_CHECKPOINT_DIR``) and
hpcrep's ``BackupAndRestore`` gather by themselves; Keras's own ``model.save``/``save_weights``
run on one rank and need :func:`consolidate` on every rank first (transparent mode's
``model.save`` does it), else they raise. Loading a Keras file takes each rank's share.

This module: the checks, the optimizer class and the state functions; the step and the slices
are in :mod:`hpcrep.tensorflow.zero_step`, the layouts in :mod:`hpcrep.tensorflow.zero_layout`.
Transparent mode shards with ``HPCREP_SHARD_OPTIMIZER_STATE=1``
(:mod:`hpcrep.tensorflow.transparent.gradients`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CheckpointError, ShardedStateError
from hpcrep.tensorflow.gradients import GradientReducer, in_reduced_scope
from hpcrep.tensorflow.replica_check import checks_replicas
from hpcrep.tensorflow.timeline import mark_step
from hpcrep.tensorflow.zero_step import ShardedState

#: Keras optimizers whose update of each element reads only that element (exact classes: a
#: subclass may override ``update_step`` with something that is not).
SHARDABLE: tuple[type, ...] = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW,
    keras.optimizers.Adamax, keras.optimizers.Adagrad, keras.optimizers.RMSprop,
    keras.optimizers.Nadam, keras.optimizers.Lion, keras.optimizers.Adadelta)


def check_shardable(optimizer: keras.optimizers.Optimizer, *, op: ReduceOp,
                    backward_passes_per_step: int, process_set: Any) -> None:
    """Raise unless ``optimizer`` with these options can shard its state exactly. Local: uses
    only what every rank knows, so every rank raises alike.

    Raises:
        ShardedStateError: naming the optimizer or option, and what to do instead.
    """
    kind = type(optimizer)
    name = kind.__name__
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ShardedStateError(
            "shard_optimizer_state=True wraps the optimizer that owns the slots, not a "
            "LossScaleOptimizer; use keras.optimizers.LossScaleOptimizer("
            "hvd.DistributedOptimizer(opt, shard_optimizer_state=True)) (what compile builds "
            "under a mixed_float16 policy)")
    if kind not in SHARDABLE:
        allowed = ", ".join(k.__name__ for k in SHARDABLE)
        raise ShardedStateError(
            f"shard_optimizer_state=True needs an optimizer that updates each element from its "
            f"own gradient and slots ({allowed}); got {kind.__module__}.{name}. Use "
            "shard_optimizer_state=False with it.")
    problems = []
    if optimizer.clipnorm:
        problems.append(f"clipnorm={optimizer.clipnorm} (clips each variable by its own norm; "
                        "use global_clipnorm, which is sharded exactly, or clipvalue)")
    if optimizer.use_ema:
        problems.append("use_ema=True (a full-size moving average per variable)")
    if optimizer.gradient_accumulation_steps:
        problems.append(f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps} "
                        "(accumulate before the optimizer instead)")
    if op not in (ReduceOp.Average, ReduceOp.Sum):
        problems.append(f"op={op.name} (gradients are reduce-scattered: Average or Sum)")
    if int(backward_passes_per_step) != 1:
        problems.append(f"backward_passes_per_step={backward_passes_per_step} (needs 1)")
    if process_set is not None:
        problems.append("process_set (the state is sharded over the whole job)")
    if problems:
        raise ShardedStateError(
            f"{name} cannot shard its state exactly with " + "; ".join(problems)
            + ". Change these options or use shard_optimizer_state=False.")


class _ShardedMixin:
    """Placed in front of a DistributedOptimizer's class: build and apply shard the state."""

    _hpcrep_zero: ShardedState

    def build(self, variables: Any) -> None:
        """Build on ``variables`` without full-size slots: this rank's share only. Local."""
        if self.built:
            return
        variables = list(variables)
        self._hpcrep_zero.build(variables)  # first: a refusal leaves the optimizer unbuilt
        keras.optimizers.Optimizer.build(self, variables)  # Keras's bookkeeping, no slots

    @checks_replicas
    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        """Reduce-scatter ``grads``, update this rank's slice, allgather the variables.

        Collective: every rank must call this, in the same order, with matching gradients.
        """
        variables = (list(self._trainable_variables) if trainable_variables is None
                     else list(trainable_variables))
        if not self.built:
            self.build(variables)
        self._hpcrep_zero.loaded = None  # shared by now, if it is to be (share_loaded_state)
        outermost = not in_reduced_scope()  # else a LossScaleOptimizer around this one reduced
        self._hpcrep_zero.apply(list(grads), variables)
        if outermost:  # the timeline's step boundary (when it records), as the unsharded apply
            mark_step("apply", "end", after=[self.iterations])

    def save_own_variables(self, store: Any) -> None:
        """Keras saving (``model.save``, ``save_weights``): write the full state as the
        unsharded optimizer would, from :func:`consolidate` (which every rank must call first,
        after the last step: Keras saves on one rank and cannot gather). Local.

        Raises:
            ShardedStateError: no consolidated state of the current step.
        """
        arrays = self._hpcrep_zero.consolidated_now()
        if arrays is None:
            raise ShardedStateError(
                f"{self.name} shards its state across ranks, and Keras's saving runs on one "
                "rank, which cannot gather it. Call hpcrep.tensorflow.zero.consolidate("
                "optimizer) on every rank first (after the last step), or checkpoint with "
                "hpcrep.checkpoint (CheckpointCallback, training_state), which gathers itself.")
        for i, a in enumerate(arrays):
            store[str(i)] = a

    def load_own_variables(self, store: Any) -> None:
        """Keras loading: take this rank's share of a full (unsharded) state. Local.

        Raises:
            CheckpointError: the stored state does not fit this optimizer.
        """
        if not self.built:
            warnings.warn(f"Skipping variable loading for optimizer '{self.name}': it is not "
                          "built yet (build it on the model's trainable variables first)",
                          stacklevel=2)
            return
        arrays = [np.asarray(store[str(i)]) for i in range(len(store.keys()))]
        check_state(self, arrays, "the stored optimizer state")
        assign_state(self, arrays)
        self._hpcrep_zero.loaded = arrays


@functools.lru_cache(maxsize=None)
def sharded_class(distributed: type, base: type) -> type:
    """Return the class in front of ``distributed`` (the DistributedOptimizer class made from
    the user's class ``base``) that shards its state: same name and module, so a saved config
    loads without hpcrep."""
    return type(distributed.__name__, (_ShardedMixin, distributed),
                {"__module__": distributed.__module__, "__qualname__": distributed.__qualname__,
                 "_hpcrep_base": base})


def shard_state(optimizer: Any, reducer: GradientReducer) -> None:
    """Give a :func:`sharded_class` optimizer its (unbuilt) sharded state. Local."""
    optimizer._hpcrep_zero = ShardedState(optimizer, reducer, type(optimizer)._hpcrep_base)


def _sharded_in(optimizer: Any) -> Optional[Any]:
    """The sharded optimizer ``optimizer`` is or wraps (a LossScaleOptimizer), else None."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if isinstance(candidate, _ShardedMixin):
            return candidate
    return None


def is_sharded(optimizer: Any) -> bool:
    """Return True if ``optimizer`` (or the one a LossScaleOptimizer wraps) shards its state."""
    return _sharded_in(optimizer) is not None


def state_arrays(optimizer: Any) -> list[np.ndarray]:
    """Return ``optimizer``'s state as numpy arrays in the layout of its unsharded variables.

    Collective when the state is sharded (every rank must call this, in the same order); local
    otherwise. The optimizer must be built.
    """
    sharded = _sharded_in(optimizer)
    if sharded is None:
        return [np.asarray(v.numpy()) for v in optimizer.variables]
    wrapper = [] if sharded is optimizer else list(optimizer._variables)
    return [np.asarray(v.numpy()) for v in wrapper] + sharded._hpcrep_zero.gather()


def state_shapes(optimizer: Any) -> list[tuple[int, ...]]:
    """Shapes of what :func:`state_arrays` returns. Local."""
    sharded = _sharded_in(optimizer)
    if sharded is None:
        return [tuple(v.shape) for v in optimizer.variables]
    wrapper = [] if sharded is optimizer else list(optimizer._variables)
    return [tuple(v.shape) for v in wrapper] + sharded._hpcrep_zero.shapes()


def assign_state(optimizer: Any, arrays: Sequence[np.ndarray]) -> None:
    """Assign arrays of :func:`state_shapes` (checked by the caller) to ``optimizer``. Local."""
    sharded = _sharded_in(optimizer)
    if sharded is None:
        for v, a in zip(optimizer.variables, arrays):
            v.assign(a)
        return
    wrapper = [] if sharded is optimizer else list(optimizer._variables)
    for v, a in zip(wrapper, arrays):
        v.assign(a)
    sharded._hpcrep_zero.load(list(arrays)[len(wrapper):])


def consolidate(optimizer: Any) -> None:
    """Gather a sharded optimizer's full state on every rank, for Keras's ``model.save`` and
    ``save_weights`` (which then write it as the unsharded optimizer would) until the next step.
    Nothing for an optimizer that does not shard its state.

    Collective: every rank must call this, in the same order.
    """
    sharded = _sharded_in(optimizer)
    if sharded is not None and sharded.built:
        state = sharded._hpcrep_zero
        state.consolidated = (int(sharded.iterations.numpy()), state.gather())


def share_loaded_state(optimizer: Any, root_rank: int = 0) -> None:
    """Give every rank its share of the full state that ``root_rank``'s Keras loading read
    (:meth:`_ShardedMixin.load_own_variables` on that rank alone). Nothing if the optimizer
    does not shard its state or ``root_rank`` loaded none.

    Collective: every rank must call this, in the same order.
    """
    sharded = _sharded_in(optimizer)
    if sharded is None or not sharded.built:
        return
    state = sharded._hpcrep_zero
    mine = state.loaded if comm.rank() == root_rank else None
    meta = comm.broadcast_object(None if mine is None else [(a.shape, a.dtype.str) for a in mine],
                                 root_rank)
    if meta is not None:
        local = mine if mine is not None else [np.empty(s, np.dtype(d)) for s, d in meta]
        arrays = comm.grouped_broadcast(local, root_rank, name="zero.loaded_state")
        assign_state(sharded, arrays)
    state.loaded = None


def check_state(optimizer: Any, arrays: Sequence[np.ndarray], what: str) -> None:
    """Raise unless ``arrays`` fit :func:`state_shapes` of ``optimizer``. Local.

    Raises:
        CheckpointError: naming the first variable whose count or shape differs.
    """
    shapes = state_shapes(optimizer)
    if len(arrays) != len(shapes):
        raise CheckpointError(
            f"{what} holds {len(arrays)} variables, {optimizer.name} has {len(shapes)} (in the "
            "unsharded layout); restore into the optimizer class and model it was saved from")
    for i, (shape, a) in enumerate(zip(shapes, arrays)):
        if tuple(shape) != tuple(np.shape(a)):
            raise CheckpointError(f"{what}: variable {i} of {optimizer.name} has shape "
                                  f"{tuple(shape)}, the saved one {tuple(np.shape(a))}")


def state_bytes(optimizer: Any) -> dict[str, int]:
    """Return the bytes this rank holds for ``optimizer``'s model and state. Local.

    ``params``: the variables it updates (every rank holds them all); ``slots``: its state
    variables with at least one dimension (momentum, moments; the step counter and other
    scalars are left out); ``shard``: the slice of the parameters a sharded optimizer keeps
    (0 otherwise). The optimizer must be built.
    """
    def nbytes(variables: Any) -> int:
        return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables
                   if len(v.shape) > 0)

    sharded = _sharded_in(optimizer)
    target = sharded if sharded is not None else optimizer
    params = nbytes(target._trainable_variables)
    if sharded is None:
        return {"params": params, "slots": nbytes(optimizer.variables), "shard": 0}
    state = sharded._hpcrep_zero
    return {"params": params, "slots": nbytes(state.inner._hpcrep_slots.values())
            + nbytes(state.extras), "shard": nbytes([state.shard])}
