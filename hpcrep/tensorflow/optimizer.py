"""DistributedOptimizer: any Keras 3 optimizer, with gradients averaged across ranks.

The wrapper is a subclass of the user's optimizer class, created on the fly with the same name and
module, so ``get_config``/serialisation are the original's and a saved model loads without
hpcrep. It overrides :meth:`apply`, Keras 3's single funnel where gradients meet variables
(``apply_gradients``, ``model.fit`` and custom loops all go through it).

Wrapping a Keras ``LossScaleOptimizer`` works in either order: ``DistributedOptimizer(LSO(opt))``
reduces before the loss-scale check, and ``LSO(DistributedOptimizer(opt))`` (what ``compile``
makes under ``mixed_float16``) does too, through :mod:`hpcrep.tensorflow.loss_scale`, so every
rank skips or applies the same steps.

With ``backward_passes_per_step=k`` gradients are summed locally for k calls and exchanged once on
the k-th, which then applies them (the optimizer's iteration counter advances once per k calls).
The sums so far and the pass counter are created when the optimizer is built, as per-rank state
besides its ``variables`` (:func:`accumulation_variables`): hpcrep's checkpoints
(``training_state``, ``CheckpointCallback``) save and restore every rank's own, so a run saved
between two applies resumes exactly. Keras's own files (``save_weights``, ``BackupAndRestore``)
are written by one rank and cannot hold them: saving one mid-accumulation warns, and loading one
starts a new accumulation.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional

import keras
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import CollectiveArgumentError, ShardedStateError
from hpcrep.tensorflow.compression import Compression
from hpcrep.tensorflow.gradients import GradientReducer, in_reduced_scope, reduced_scope
from hpcrep.tensorflow.powersgd import is_stateful
from hpcrep.tensorflow.replica_check import checks_replicas
from hpcrep.tensorflow.timeline import mark_step
from hpcrep.tensorflow.variables import local_layer_variables, variable_key
from hpcrep.tensorflow import zero


class _DistributedMixin:
    """Methods placed in front of the user's optimizer class. State lives in ``_hpcrep_*``."""

    _hpcrep_reducer: GradientReducer
    _hpcrep_passes: int
    _hpcrep_average_passes: bool

    def register_local_var(self, var: Any) -> None:
        """Keep ``var``'s gradient on this rank (not exchanged), as Horovod's optimizer does.

        With ``scale_local_gradients=True`` (the default, as in Horovod) that gradient is divided
        by ``size``. Local: each rank registers its own variables, the same ones on every rank.
        """
        self._hpcrep_reducer.local.add(variable_key(var))

    def build(self, variables: Any) -> None:
        """Keras's ``build``, then the compression's state (PowerSGD's) as this optimizer's
        variables, after Keras's own, and the accumulators of ``backward_passes_per_step``.
        Local."""
        super().build(variables)
        reducer = getattr(self, "_hpcrep_reducer", None)  # None while from_config constructs
        if reducer is not None:
            reducer.build_state(self, list(variables))
        if getattr(self, "_hpcrep_passes", 1) > 1:
            self._hpcrep_build_accumulators(list(variables))

    def save_own_variables(self, store: Any) -> None:
        """Keras saving: the optimizer's variables; warns when gradients accumulated for
        ``backward_passes_per_step`` are pending, which a Keras file cannot hold. Local."""
        count = getattr(self, "_hpcrep_count", None)
        if count is not None and int(count.numpy()) % self._hpcrep_passes:
            warnings.warn(
                f"{self.name}: saved by Keras between two applies of backward_passes_per_step="
                f"{self._hpcrep_passes} ({int(count.numpy()) % self._hpcrep_passes} pass(es) "
                "accumulated); the file holds no per-rank partial sums, so a resume from it "
                "starts a new accumulation and differs from an uninterrupted run. Save after a "
                "multiple of backward_passes_per_step passes, or checkpoint with "
                "hpcrep.checkpoint (training_state, CheckpointCallback), which holds them.",
                stacklevel=2)
        super().save_own_variables(store)

    def load_own_variables(self, store: Any) -> None:
        """Keras loading: the optimizer's variables, and a new accumulation (the loaded state
        follows no pass of this run). Local."""
        super().load_own_variables(store)
        for v in accumulation_variables(self):
            v.assign(tf.zeros_like(v))

    @checks_replicas  # the replica canary, every HPCREP_CHECK_REPLICAS steps
    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        """Reduce ``grads`` across ranks, then apply them as the wrapped optimizer would.

        Collective: every rank must call this, in the same order, with matching gradients.
        """
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        if in_reduced_scope():  # an outer LossScaleOptimizer reduced them before its check
            return super().apply(grads, variables)
        if self._hpcrep_passes == 1:  # Keras's apply builds the optimizer on its first call
            self._hpcrep_reducer.build_before_reducing(self, variables)  # PowerSGD's state
            reduced = self._hpcrep_reducer.reduce(grads, self._hpcrep_sources(variables))
            with reduced_scope():  # a LossScaleOptimizer base class must not reduce again
                applied = super().apply(reduced, variables)
            # The timeline's step boundary (when it records): after the exchange has returned
            # (stateful host calls are not ordered after the variable updates by themselves).
            mark_step("apply", "end", after=[reduced, self.iterations])
            return applied
        if not self.built:
            if variables is None:
                raise CollectiveArgumentError(
                    f"{self.name}: apply(grads) without trainable_variables needs a built "
                    f"optimizer (backward_passes_per_step={self._hpcrep_passes} sums gradients "
                    "per variable); pass the variables on the first call or call "
                    "optimizer.build(variables) first")
            # Keras's own build, once, here: its apply would otherwise create the slots inside
            # the tf.cond branch below, which runs only on the k-th pass.
            self.build(variables)
        applied = self._hpcrep_accumulate_and_apply(grads, variables)
        mark_step("apply", "end", after=applied)
        return applied

    def _hpcrep_sources(self, variables: Optional[list]) -> list:
        """The variables ``grads`` belong to: those passed, else those the optimizer was built on
        (empty if it is not built: then Keras's ``apply`` raises, asking for them)."""
        return variables if variables is not None else list(self._trainable_variables)

    def _hpcrep_accumulate_and_apply(self, grads: list, variables: Optional[list]) -> Any:
        sources = self._hpcrep_sources(variables)
        # In the order of ``sources``: the accumulators are in the order the optimizer was built.
        accumulators = [self._hpcrep_acc[self._get_variable_index(v)] for v in sources]
        count = self._hpcrep_count
        for acc, g in zip(accumulators, grads):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        count.assign_add(1)
        passes = self._hpcrep_passes

        def exchange_and_apply() -> tf.Tensor:
            scale = 1.0 / passes if self._hpcrep_average_passes else 1.0
            summed = [None if g is None else acc * scale for acc, g in zip(accumulators, grads)]
            reduced = self._hpcrep_reducer.reduce(summed, sources)
            with reduced_scope():
                super(_DistributedMixin, self).apply(reduced, variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        return tf.cond(tf.equal(count % passes, 0), exchange_and_apply,
                       lambda: tf.constant(False))

    def _hpcrep_build_accumulators(self, variables: list) -> None:
        # Plain tf.Variables, not optimizer variables: a Keras file of the optimizer stays
        # loadable without hpcrep. Created once, outside any tf.function trace.
        if getattr(self, "_hpcrep_acc", None) is None:
            with tf.init_scope():
                self._hpcrep_acc = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                name="hpcrep_accumulator") for v in variables]
                self._hpcrep_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                                 name="hpcrep_pass_count")


def accumulation_variables(optimizer: Any) -> list[tf.Variable]:
    """Return the pass counter and the per-variable sums of ``backward_passes_per_step``
    (this rank's own) that ``optimizer``, or the optimizer a LossScaleOptimizer wraps, holds
    besides its ``variables``; empty for one pass per step or before it is built. Local."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if isinstance(candidate, _DistributedMixin) and getattr(candidate, "_hpcrep_acc", None):
            return [candidate._hpcrep_count, *candidate._hpcrep_acc]
    return []


@functools.lru_cache(maxsize=None)
def _distributed_class(base: type) -> type:
    """Return the subclass of ``base`` that reduces gradients: same name, same module."""
    if issubclass(base, _DistributedMixin):
        return base
    return type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__,
                                                           "__qualname__": base.__qualname__})


def is_distributed(optimizer: Any) -> bool:
    """Return True if ``optimizer`` already reduces its gradients across ranks."""
    return isinstance(optimizer, _DistributedMixin)


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: Optional[str] = None,
                         use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "",
                         compression: Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                         op: Any = ReduceOp.Average, gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True,
                         shard_optimizer_state: bool = False) -> keras.optimizers.Optimizer:
    """Return a copy of ``optimizer`` whose ``apply`` averages gradients across ranks first.

    Arguments follow ``horovod.tensorflow.keras.DistributedOptimizer``: with ``process_set``
    the gradients are averaged over that set, and ranks outside it apply their own gradients
    unreduced (as Horovod does). ``device_*`` and ``use_locking`` are accepted and ignored
    (hpcrep reduces on the host). Variables registered with ``register_local_var`` keep their
    local gradient, divided by ``size`` when ``scale_local_gradients`` (Horovod's default). The
    copy is built from ``optimizer.get_config()``, so pass a fresh optimizer.

    ``op=Adasum`` combines the gradients with Adasum, as Horovod's Keras optimizer does (with
    ``backward_passes_per_step=k``, the sum of the k passes; ``average_aggregated_gradients`` is
    refused, as in Horovod); the learning rate is not scaled (Horovod's guide suggests the
    one-worker rate times about 2 on CPUs). Only on the whole job, on 1, 2, 4, ... ranks.

    ``compression=hvd.Compression.powersgd(rank=2, warmup_steps=...)`` sends low-rank factors
    of matrix gradients with error feedback (:mod:`hpcrep.tensorflow.powersgd`); its state is
    created when the optimizer is built, as variables of the optimizer (error buffers: per rank,
    saved by hpcrep's checkpoints).

    ``shard_optimizer_state=True`` (ZeRO stage 1, :mod:`hpcrep.tensorflow.zero`): each rank
    keeps 1/size of the optimizer's slots; gradients are reduce-scattered, each rank updates
    its slice of the variables and the slices are allgathered. Results equal the unsharded
    optimizer's up to the order of the gradient sum, bitwise equal on every rank. Keras's
    elementwise optimizers only (SGD, Adam, AdamW, ...); options it cannot reproduce exactly
    raise :class:`~hpcrep.errors.ShardedStateError` on every rank. On one rank it is the plain
    optimizer. Checkpoint with :mod:`hpcrep.checkpoint` (the state is gathered to full shape).

    Raises:
        CollectiveArgumentError: invalid ``op``, ``backward_passes_per_step`` or factors.
        ShardedStateError: ``shard_optimizer_state`` with an optimizer or option it cannot
            shard exactly.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise CollectiveArgumentError(
            f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.Optimizer); got "
            f"{type(optimizer).__name__}. Legacy tf.compat.v1 optimizers are not supported.")
    if int(backward_passes_per_step) < 1:
        raise CollectiveArgumentError(
            f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if as_reduce_op(op) is ReduceOp.Adasum and average_aggregated_gradients:
        raise CollectiveArgumentError(
            "Adasum does not support average_aggregated_gradients == True (as in Horovod); "
            "drop it (Adasum combines the summed gradients of the k passes) or use op=Average")
    if shard_optimizer_state and is_stateful(compression):
        raise ShardedStateError(
            "shard_optimizer_state=True cannot be combined with a stateful compression such as "
            "Compression.powersgd yet (its error buffers are per full gradient; ZeRO's step "
            "reduce-scatters flat slices): use Compression.none or fp16, or do not shard")
    if shard_optimizer_state:
        zero.check_shardable(optimizer, op=as_reduce_op(op),
                             backward_passes_per_step=backward_passes_per_step,
                             process_set=process_set)
    reducer = GradientReducer(
        op=op, compression=compression, sparse_as_dense=sparse_as_dense, num_groups=num_groups,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    cls = _distributed_class(type(optimizer))
    sharded = shard_optimizer_state and comm.size() > 1  # one rank: the plain optimizer
    dist = (zero.sharded_class(cls, type(optimizer)) if sharded else cls).from_config(config)
    dist._hpcrep_reducer = reducer
    dist._hpcrep_passes = int(backward_passes_per_step)
    dist._hpcrep_average_passes = bool(average_aggregated_gradients)
    dist._hpcrep_acc = None
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, attr):  # exclude_from_weight_decay(): not in get_config()
            setattr(dist, attr, getattr(optimizer, attr))
    if sharded:
        zero.shard_state(dist, reducer)
    return dist


def shard_in_place(optimizer: keras.optimizers.Optimizer, reducer: GradientReducer) -> None:
    """Make an unbuilt plain ``optimizer`` (same object) shard its state across ranks, as
    ``DistributedOptimizer(optimizer, shard_optimizer_state=True)`` does, reducing with
    ``reducer`` (transparent mode, ``HPCREP_SHARD_OPTIMIZER_STATE``). Local.

    Raises:
        ShardedStateError: ``optimizer`` cannot shard its state, or is built already.
    """
    zero.check_shardable(optimizer, op=reducer.op, backward_passes_per_step=1,
                         process_set=reducer.process_set)
    if optimizer.built:
        raise ShardedStateError(
            f"{optimizer.name} was built (its full-size slots exist) before its state could be "
            "sharded; create and build it inside transparent mode, or do not shard")
    object.__setattr__(optimizer, "__class__",
                       zero.sharded_class(_distributed_class(type(optimizer)), type(optimizer)))
    optimizer._hpcrep_reducer = reducer
    optimizer._hpcrep_passes = 1
    optimizer._hpcrep_average_passes = False
    optimizer._hpcrep_acc = None
    zero.shard_state(optimizer, reducer)


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, *,
                                local_layers: Any = None,
                                **options: Any) -> keras.optimizers.Optimizer:
    """A :func:`DistributedOptimizer` that keeps the gradients of ``local_layers`` local.

    The trainable weights of each layer in ``local_layers`` (built layers) are registered with
    ``register_local_var``. ``options`` are :func:`DistributedOptimizer`'s keyword arguments
    (``name``, ``compression``, ``op``, ``process_set``, ``scale_local_gradients``, ...); unlike
    Horovod's, this function takes them by keyword only.

    Raises:
        CollectiveArgumentError: ``local_layers`` holds something that is not a Keras layer.
    """
    local = local_layer_variables(local_layers)
    dist = DistributedOptimizer(optimizer, **options)
    for variable in local:
        dist.register_local_var(variable)
    return dist
