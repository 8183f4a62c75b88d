"""Every Keras optimizer applies gradients averaged across ranks.

Keras 3's ``BaseOptimizer.apply`` is the one funnel where gradients meet variables
(``apply_gradients``, ``model.fit`` and custom loops, eager or inside ``tf.function``). The patch is
one wrapper around it: average the gradients with the explicit API's
:class:`~hpcrep.tensorflow.gradients.GradientReducer` (the code ``DistributedOptimizer`` runs),
then call the original ``apply``, once. The optimizer keeps its class and its object, so an
override of ``apply`` in the user's subclass runs once per step, on the local gradients, before
the average.

A :func:`~hpcrep.tensorflow.DistributedOptimizer` has already averaged in its own ``apply`` when
its ``super().apply`` reaches the patch, which then calls the original straight away. Optimizers
that override ``apply`` and delegate to an inner optimizer average in the inner one, except
Keras's ``LossScaleOptimizer``, which averages with the same reducer before its finiteness check
(:mod:`hpcrep.tensorflow.loss_scale`): a rank whose local gradients overflow would otherwise skip
the step, and the exchange, while the others wait in it.

``HPCREP_COMPRESSION`` chooses how the gradients travel: ``none``, ``fp16``, or
``powersgd:R[:W]`` (:mod:`hpcrep.tensorflow.powersgd`). PowerSGD keeps state per optimizer: each
optimizer gets its own reducer, and Keras's ``build`` is patched too, so that the state becomes
the optimizer's variables when it is built (before a checkpoint is restored into it, as
``CheckpointCallback`` does at the start of ``fit``). A ``LossScaleOptimizer`` is refused with
PowerSGD here (the explicit ``hvd.DistributedOptimizer(LossScaleOptimizer(opt),
compression=...)`` takes it).

With ``HPCREP_TRANSPARENT_SCALE_LR`` the rate is multiplied by the number of ranks the first time
an optimizer applies gradients (:mod:`hpcrep.tensorflow._keras.lr_scale`, which also keeps the
factor out of saved files).
"""

from __future__ import annotations

import weakref
from typing import Any

import keras

from hpcrep import comm, config
from hpcrep.errors import TransparentModeError
from hpcrep.tensorflow import loss_scale
from hpcrep.tensorflow.compression import Compression
from hpcrep.tensorflow.gradients import GradientReducer, in_reduced_scope
from hpcrep.tensorflow._keras.lr_scale import scale_learning_rate
from hpcrep.tensorflow import zero
from hpcrep.tensorflow.optimizer import is_distributed, shard_in_place
from hpcrep.tensorflow.replica_check import checks_replicas
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class


def install(patches: PatchSet) -> None:
    """Patch ``apply`` of every Keras optimizer. Local."""
    owner = defining_class(keras.optimizers.Optimizer, "apply")
    original = vars(owner)["apply"]
    kind, rank, warmup = config.get("HPCREP_COMPRESSION")
    # Average, no local variables: the defaults; the compression HPCREP_COMPRESSION names.
    reducer = GradientReducer(compression=Compression.fp16 if kind == "fp16" else
                              Compression.none)
    own: "weakref.WeakKeyDictionary[Any, GradientReducer]" = weakref.WeakKeyDictionary()
    seen: "weakref.WeakSet[Any]" = weakref.WeakSet()
    scale = config.get("HPCREP_TRANSPARENT_SCALE_LR") and comm.size() > 1
    shard = config.get("HPCREP_SHARD_OPTIMIZER_STATE") and comm.size() > 1
    if shard and kind == "powersgd":
        raise TransparentModeError(
            "HPCREP_SHARD_OPTIMIZER_STATE=1 and HPCREP_COMPRESSION=powersgd cannot be combined "
            "yet (PowerSGD's error buffers are per full gradient, ZeRO's step reduce-scatters "
            "flat slices): unset one of them")

    def reducer_of(optimizer: Any) -> GradientReducer:
        """The shared reducer, or with PowerSGD the optimizer's own (state per optimizer)."""
        if kind != "powersgd":
            return reducer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise TransparentModeError(
                f"HPCREP_COMPRESSION=powersgd:{rank} does not take a LossScaleOptimizer "
                "(mixed_float16) in transparent mode; use HPCREP_COMPRESSION=none or fp16, or "
                "the explicit hvd.DistributedOptimizer(LossScaleOptimizer(opt), "
                "compression=hvd.Compression.powersgd(...))")
        if optimizer not in own:
            own[optimizer] = GradientReducer(
                compression=Compression.powersgd(rank=rank, warmup_steps=warmup))
        return own[optimizer]

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        """Average ``grads`` across ranks, then apply them with Keras's ``apply``.

        Collective: every rank must call this, in the same order, with matching gradients.
        """
        if is_distributed(self) or in_reduced_scope():  # averaged already: by a
            # DistributedOptimizer's apply, or by a LossScaleOptimizer around this one
            return original(self, grads, trainable_variables)
        if shard and (self.built or trainable_variables is not None):
            # HPCREP_SHARD_OPTIMIZER_STATE: only optimizers that shard their state apply
            if self.built or type(self) not in zero.SHARDABLE:
                shard_in_place(self, reducer)  # raises, saying why it cannot
            self.build(list(trainable_variables))  # the patched build below shards it
            return self.apply(grads, trainable_variables)
        if self not in seen:
            seen.add(self)
            if scale:
                scale_learning_rate(self, comm.size())
        variables = None if trainable_variables is None else list(trainable_variables)
        reducer_of(self).build_before_reducing(self, variables)  # PowerSGD's state first
        sources = variables if variables is not None else (
            list(self._trainable_variables) if self.built else None)
        return original(self, reducer_of(self).reduce(list(grads), sources),
                        trainable_variables)

    patches.attr(owner, "apply", checks_replicas(apply))  # the replica canary
    if kind == "powersgd":
        build_owner = defining_class(keras.optimizers.Optimizer, "build")
        original_build = vars(build_owner)["build"]

        def build(self: Any, variables: Any) -> None:
            """Keras's ``build``, then this optimizer's PowerSGD state as its variables. Local."""
            original_build(self, variables)
            if not is_distributed(self):  # a DistributedOptimizer builds its own
                reducer_of(self).build_state(self, list(variables))

        patches.attr(build_owner, "build", build)
        patches.label(f"optimizer build (PowerSGD rank {rank}, warm-up {warmup} state)")
    if shard:
        _shard_on_build(patches, reducer, scale)
    # A LossScaleOptimizer averages with the same reducer, before its finiteness check, so
    # every rank skips or applies the same steps (hvd.init() installed its wrapper).
    patches.attr(loss_scale, "transparent_reducer", reducer)
    patches.label("optimizer apply (gradients averaged; LossScaleOptimizer: before its check)")
    patches.label(f"learning rate x{comm.size() if scale else 1}"
                  f"{'' if scale else ' (HPCREP_TRANSPARENT_SCALE_LR=1 for xN)'}")


def _shard_on_build(patches: PatchSet, reducer: GradientReducer, scale: bool) -> None:
    """Patch ``build`` of the optimizers that can shard their state: the first build makes the
    optimizer (the same object) shard it, before any full-size slot exists. Exact classes only:
    a user's subclass, or another optimizer, is refused when it applies. Local."""
    owners = list(dict.fromkeys(defining_class(k, "build") for k in zero.SHARDABLE))
    for kind in owners:  # AdamW builds with Adam's build: patched once
        original = vars(kind)["build"]

        def build(self: Any, variables: Any, _original: Any = original) -> Any:
            if is_distributed(self) or type(self) not in zero.SHARDABLE:  # an explicit
                return _original(self, variables)  # DistributedOptimizer, a subclass
            shard_in_place(self, reducer)
            if scale:
                scale_learning_rate(self, comm.size())
            return self.build(variables)

        patches.attr(kind, "build", build)
    patches.label("optimizer state sharded across ranks (HPCREP_SHARD_OPTIMIZER_STATE=1)")
