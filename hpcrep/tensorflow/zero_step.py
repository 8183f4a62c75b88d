"""The sharded step of :mod:`hpcrep.tensorflow.zero`: this rank's slice and its optimizer.

:class:`ShardedState` is what a sharded optimizer holds: the :class:`~hpcrep.tensorflow.
zero_layout.FlatLayout`, this rank's slice of the parameters as one variable, and an *inner*
copy of the user's optimizer built on that variable (so its slots are slices too). It runs the
step (reduce-scatter, update, allgather) and converts the state to and from the unsharded
layout (:func:`~hpcrep.tensorflow.zero_layout.full_layout`) for checkpoints.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import ShardedStateError
from hpcrep.tensorflow import collectives
from hpcrep.tensorflow.bridge import host_call
from hpcrep.tensorflow.gradients import GradientReducer, in_reduced_scope, reduced_scope
from hpcrep.tensorflow.zero_layout import Entry, FlatLayout, full_layout


class _InnerMixin:
    """In front of the inner copy's class: it counts steps and reads the learning rate through
    the wrapper (whose variables are the ones saved, broadcast and scheduled), and it records
    which of its variables are slots."""

    _hpcrep_outer: Any

    @property
    def iterations(self) -> Any:
        return self._hpcrep_outer.iterations

    def _get_current_learning_rate(self) -> Any:
        return self._hpcrep_outer._get_current_learning_rate()

    def add_variable_from_reference(self, reference_variable: Any, name: Optional[str] = None,
                                    initializer: Any = "zeros") -> Any:
        slot = super().add_variable_from_reference(reference_variable, name, initializer)
        self._hpcrep_slots[name or "var"] = slot
        return slot


@functools.lru_cache(maxsize=None)
def _inner_class(base: type) -> type:
    return type(base.__name__, (_InnerMixin, base), {"__module__": base.__module__})


class ShardedState:
    """This rank's share of an optimizer's state, and the sharded step. Held by the wrapper.

    Args:
        outer: the optimizer the user holds (its class derives from ``base``).
        reducer: how gradients are reduced (op, compression, predivide factor).
        base: the user's optimizer class, whose ``build`` and ``update_step`` the inner copy
            runs.
    """

    def __init__(self, outer: keras.optimizers.Optimizer, reducer: GradientReducer,
                 base: type) -> None:
        self.outer = outer
        self.base = base  # the user's optimizer class (outer's class derives from it)
        self.reducer = reducer
        self.communicator = comm.resolve(None)
        self.layout: Optional[FlatLayout] = None
        self.entries: list[Entry] = []
        self.shard: Any = None
        self.inner: Any = None
        self.decay_mask: Optional[list[bool]] = None  # per variable, when some are excluded
        self.consolidated: Optional[tuple[int, list[np.ndarray]]] = None  # (step, full state)
        self.loaded: Optional[list[np.ndarray]] = None  # the full state Keras loaded here

    # -- build ---------------------------------------------------------------------------------

    def build(self, variables: Sequence[Any]) -> None:
        """Create this rank's parameter slice and the inner optimizer on it. Local.

        Runs eagerly even when called inside a ``tf.function`` trace (the first ``apply`` of a
        custom loop): the optimizer's config reads the learning rate's value, and the slice and
        the inner copy's variables must be created once, outside the graph, as Keras creates
        its own optimizer variables.
        """
        with tf.init_scope():
            self._build(list(variables))

    def _build(self, variables: list[Any]) -> None:
        dtypes = {tf.as_dtype(v.dtype) for v in variables}
        if len(dtypes) != 1:
            raise ShardedStateError(
                f"{self.outer.name}: shard_optimizer_state=True needs trainable variables of one "
                f"dtype; got {sorted(d.name for d in dtypes)}. Keep the variables in one dtype "
                "(a mixed precision policy keeps them float32) or do not shard.")
        for v in variables:
            if getattr(v, "overwrite_with_gradient", False):
                raise ShardedStateError(
                    f"{self.outer.name}: variable {_label(v)} is overwritten with its gradient "
                    "(float8 scaling), which sharded optimizer state does not support.")
        self.dtype = dtypes.pop()
        self.layout = FlatLayout(tuple(tuple(int(d) for d in v.shape) for v in variables),
                                 self.communicator.size(), self.communicator.rank())
        config_of_outer = self.outer.get_config()
        config = dict(config_of_outer)
        config.update(name=f"{self.outer.name}_shard", global_clipnorm=None, clipnorm=None)
        if self.outer.weight_decay is not None:
            decayed = [bool(self.outer._use_weight_decay(v)) for v in variables]
            if not all(decayed):  # Keras decays per variable: done here, with a mask
                self.decay_mask = decayed
        self.entries = full_layout(self.base, config_of_outer, variables)
        self.shard = keras.Variable(keras.initializers.Zeros(), shape=(self.layout.shard,),
                                    dtype=self.dtype.name, trainable=False,
                                    name="hpcrep_zero_shard")
        self.inner = _inner_class(self.base).from_config(config)
        object.__setattr__(self.inner, "_hpcrep_outer", self.outer)
        object.__setattr__(self.inner, "_hpcrep_slots", {})
        if self.decay_mask is not None:  # the inner copy must not decay the whole slice
            self.inner.exclude_from_weight_decay(var_list=[self.shard])
        self.inner.build([self.shard])
        slot_ids = {id(s) for s in self.inner._hpcrep_slots.values()}
        initial = len(self.outer.variables)
        self.extras = [v for v in self.inner.variables[initial:] if id(v) not in slot_ids]

    # -- the step ------------------------------------------------------------------------------

    def apply(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        """Reduce-scatter ``grads``, update this rank's slice, allgather it into ``variables``.

        Collective: every rank must call this, in the same order, with gradients of the same
        variables (those the optimizer was built on).
        """
        assert self.layout is not None
        if self.reducer.local:
            raise ShardedStateError(
                f"{self.outer.name}: variables registered with register_local_var keep their "
                "own gradient on each rank, which sharded optimizer state cannot update; use "
                "shard_optimizer_state=False with local variables")
        ordered = self._in_layout_order(list(grads), list(variables))
        layout = self.layout
        flat = tf.concat([tf.reshape(tf.cast(g, self.dtype), [-1]) for g, _ in ordered]
                         + ([tf.zeros([layout.padded - layout.total], self.dtype)]
                            if layout.padded > layout.total else []), axis=0)
        if in_reduced_scope():  # averaged already (a LossScaleOptimizer around this one)
            grad = flat[layout.start:layout.stop]
        else:
            grad = self._reduce_scatter(flat)
        params = [v for _, v in ordered]
        self.shard.assign(self._my_slice(params))
        if self.outer.global_clipnorm:
            grad = self._clip_by_global_norm(grad)
        if self.decay_mask is not None:
            self._decay_with_mask()
        with reduced_scope():  # reduced here: transparent mode's apply must not reduce again
            self.inner.apply([grad], [self.shard])
        self.outer._iterations.assign_add(1)
        full = _allgather(self.shard.value, layout.padded, self.communicator,
                          f"zero.{self.outer.name}.params")
        for (offset, count), v in zip(zip(layout.offsets, layout.counts), params):
            v.assign(tf.reshape(full[offset:offset + count], v.shape))
            constraint = getattr(v, "constraint", None)
            if constraint is not None:
                v.assign(constraint(v))

    def _in_layout_order(self, grads: list, variables: list) -> list[tuple[Any, Any]]:
        assert self.layout is not None
        if len(variables) != len(self.layout.shapes):
            raise ShardedStateError(
                f"{self.outer.name} was built on {len(self.layout.shapes)} variables and got "
                f"gradients for {len(variables)}; sharded optimizer state updates the variables "
                "it was built on, all of them, every step (a frozen layer: set trainable=False "
                "before compiling or building the optimizer)")
        ordered: list = [None] * len(variables)
        for g, v in zip(grads, variables):
            try:
                i = self.outer._get_variable_index(v)
            except KeyError:
                raise ShardedStateError(
                    f"{self.outer.name}: unknown variable {_label(v)}; it was built on other "
                    "variables (recreate the optimizer for a new set)") from None
            if g is None:
                raise ShardedStateError(
                    f"{self.outer.name}: no gradient for {_label(v)}. With sharded optimizer "
                    "state every variable must get a gradient every step (Keras would skip it); "
                    "set trainable=False on layers that take no part in the loss.")
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            ordered[i] = (g, v)
        if any(o is None for o in ordered):
            raise ShardedStateError(f"{self.outer.name}: a variable was passed twice")
        return ordered

    def _my_slice(self, params: Sequence[Any]) -> tf.Tensor:
        """This rank's elements of the flat parameter vector (zeros in the padding)."""
        assert self.layout is not None
        parts = [tf.reshape(params[i], [-1])[a:b] for i, a, b in self.layout.pieces()]
        if self.layout.padding:
            parts.append(tf.zeros([self.layout.padding], self.dtype))
        return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]

    def _reduce_scatter(self, flat: tf.Tensor) -> tf.Tensor:
        assert self.layout is not None
        r, n = self.reducer, self.communicator.size()
        if r.op is ReduceOp.Average and r.gradient_predivide_factor != 1.0:
            op, pre, post = ReduceOp.Sum, 1.0 / r.gradient_predivide_factor, \
                r.gradient_predivide_factor / n
        else:
            op, pre, post = r.op, 1.0, 1.0
        packed, context = r.compression.compress(flat)
        communicator, name = self.communicator, f"zero.{self.outer.name}.gradients"

        def scatter(a: np.ndarray) -> list[np.ndarray]:
            return comm.grouped_reducescatter([a], op, pre, post, name, communicator)

        out = host_call(scatter, [packed], [packed.dtype], [tf.TensorShape([self.layout.shard])],
                        name="hpcrep_reducescatter")[0]
        return tf.cast(r.compression.decompress(out, context), self.dtype)

    def _clip_by_global_norm(self, grad: tf.Tensor) -> tf.Tensor:
        """Keras's ``clip_by_global_norm`` with the squared norm summed over the slices (one
        allreduce of one number)."""
        squared = tf.reshape(tf.reduce_sum(tf.square(grad)), [1])
        total = collectives.allreduce(squared, op=ReduceOp.Sum, name=f"zero.{self.outer.name}"
                                      ".norm", process_set=self.communicator)[0]
        use_norm = tf.sqrt(total)
        clip = self.outer.global_clipnorm
        scale = clip * tf.minimum(1.0 / use_norm, 1.0 / clip) + (use_norm - use_norm)
        return grad * tf.cast(scale, grad.dtype)

    def _decay_with_mask(self) -> None:
        """Keras's weight decay, ``v - v * wd * lr``, on the elements of decayed variables."""
        assert self.layout is not None and self.decay_mask is not None
        parts = [tf.fill([b - a], self.decay_mask[i]) for i, a, b in self.layout.pieces()]
        if self.layout.padding:
            parts.append(tf.fill([self.layout.padding], False))
        mask = tf.concat(parts, axis=0)
        lr = tf.cast(self.outer.learning_rate, self.dtype)
        wd = tf.cast(self.outer.weight_decay, self.dtype)
        v = self.shard.value
        self.shard.assign(tf.where(mask, v - v * wd * lr, v))

    # -- state in the unsharded layout ---------------------------------------------------------

    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the unsharded optimizer's variables, in its order. Local."""
        assert self.layout is not None
        own = self.outer.variables
        return [tuple(self.layout.shapes[e.index]) if e.kind == "slot"
                else tuple(own[e.index].shape) if e.kind == "own"
                else tuple(self.extras[e.index].shape) for e in self.entries]

    def gather(self) -> list[np.ndarray]:
        """Return the state as the unsharded optimizer's variables would hold it.

        Collective: every rank must call this, in the same order (one allgather of the slots).
        """
        assert self.layout is not None
        names = sorted(self.inner._hpcrep_slots)
        slots = [np.asarray(self.inner._hpcrep_slots[k].numpy()) for k in names]
        gathered = comm.grouped_allgather(slots, f"zero.{self.outer.name}.state",
                                          self.communicator)
        full = dict(zip(names, gathered))
        own = self.outer.variables
        out = []
        for e in self.entries:
            if e.kind == "slot":
                offset, count = self.layout.offsets[e.index], self.layout.counts[e.index]
                out.append(np.array(full[e.name][offset:offset + count]
                                    .reshape(self.layout.shapes[e.index])))
            else:
                source = own[e.index] if e.kind == "own" else self.extras[e.index]
                out.append(np.asarray(source.numpy()))
        return out

    def consolidated_now(self) -> Optional[list[np.ndarray]]:
        """The arrays :func:`consolidate` gathered, if taken at the current step. Local."""
        step = int(self.outer.iterations.numpy())
        if self.consolidated is None or self.consolidated[0] != step:
            return None
        return self.consolidated[1]

    def load(self, arrays: Sequence[np.ndarray]) -> None:
        """Assign the unsharded layout's ``arrays`` (shapes checked by the caller): the scalars
        as they are, each slot's slice for this rank. Local."""
        assert self.layout is not None
        own = self.outer.variables
        by_slot: dict[str, dict[int, np.ndarray]] = {}
        for e, a in zip(self.entries, arrays):
            if e.kind == "slot":
                by_slot.setdefault(e.name, {})[e.index] = np.asarray(a)
            else:
                (own[e.index] if e.kind == "own" else self.extras[e.index]).assign(a)
        for name, slot in self.inner._hpcrep_slots.items():
            parts = [by_slot[name][i].reshape(-1)[a:b] for i, a, b in self.layout.pieces()]
            parts.append(np.zeros(self.layout.padding, slot.dtype))
            slot.assign(np.concatenate(parts).astype(slot.dtype))


def _allgather(value: tf.Tensor, length: int, communicator: comm.Communicator,
               name: str) -> tf.Tensor:
    """Concatenate every rank's equal-length 1-D ``value`` (no gradient). Collective."""
    def gather(a: np.ndarray) -> list[np.ndarray]:
        return comm.grouped_allgather([a], name, communicator)

    return host_call(gather, [value], [value.dtype], [tf.TensorShape([length])],
                     name="hpcrep_allgather")[0]


def _label(variable: Any) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", variable))
