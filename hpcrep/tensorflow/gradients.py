"""Averaging gradients across ranks: the one place DistributedOptimizer and
DistributedGradientTape share.

A :class:`GradientReducer` takes a list of gradients (``None`` entries and ``tf.IndexedSlices``
allowed) and returns them reduced across ranks, each group in fusion buckets
(``HPCREP_FUSION_THRESHOLD``). With ``HPCREP_OVERLAP`` (the default) the buckets are planned from
the last gradient back, the order in which the backward pass produces them, and on the compiled
path (:mod:`hpcrep.tensorflow.native`) each bucket's exchange starts as soon as its own gradients
exist, inside ``tf.function`` while the backward pass goes on; the order is fixed at trace time
and the same on every rank. ``HPCREP_OVERLAP=0`` makes every bucket wait for all gradients.
Gradients of variables registered as local (model-parallel layers: ``register_local_source``,
``register_local_var``) are not exchanged; like Horovod (``scale_local_gradients=True``) hpcrep
divides them by ``size``.

A stateful compression (``Compression.powersgd(...)``, :mod:`hpcrep.tensorflow.powersgd`) is
not applied per tensor: the reducer hands it the whole list of dense gradients with their
variables, and it runs its own exchanges (the bucketed allreduce during its warm-up). It runs at
one rank too, so that training behaves the same at every number of ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator, Optional, Sequence

import keras
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow import autotune, collectives
from hpcrep.tensorflow.compression import Compression
from hpcrep.tensorflow.powersgd import is_stateful
from hpcrep.tensorflow.variables import variable_key

_scope = threading.local()


@contextlib.contextmanager
def reduced_scope() -> Iterator[None]:
    """Mark the gradients applied inside this block as reduced across ranks already.

    An optimizer that wraps another (Keras's ``LossScaleOptimizer``, a ``DistributedOptimizer``
    around one) reduces once, in the outermost ``apply``, and calls the inner ``apply`` inside this
    block; the inner one (a ``DistributedOptimizer``, transparent mode's patch) then applies the
    gradients as they are instead of reducing them again. Per thread, so it holds while a
    ``tf.function`` traces the inner ``apply``. Local.
    """
    depth = getattr(_scope, "depth", 0)
    _scope.depth = depth + 1
    try:
        yield
    finally:
        _scope.depth = depth


def in_reduced_scope() -> bool:
    """Return True inside :func:`reduced_scope` on this thread. Local."""
    return getattr(_scope, "depth", 0) > 0


@dataclasses.dataclass
class GradientReducer:
    """How gradients are reduced: Horovod's DistributedOptimizer/Tape options.

    Attributes:
        op: Average (default), Sum or Adasum (Horovod's: the gradients themselves are combined
            with Adasum, float16/32/64 only, power-of-two ranks; IndexedSlices need
            ``sparse_as_dense``).
        compression: ``Compression.none``, ``Compression.fp16`` or a
            ``Compression.powersgd(...)`` object (Average only, no predivide factor).
        sparse_as_dense: convert ``tf.IndexedSlices`` to dense tensors before reducing.
        gradient_predivide_factor: with Average, divide by this before the sum and by
            ``size / factor`` after it (Horovod semantics).
        num_groups: split the gradients into this many fused exchanges (0: one).
        groups: explicit grouping, a list of lists of variables (overrides ``num_groups``;
            a variable in no list is reduced on its own, as in Horovod), or a number of groups.
        process_set: ranks to reduce over (a process set or communicator); None: the current
            communicator when :meth:`reduce` is called (traced). On ranks outside a process
            set the gradients pass through unreduced (Horovod's semantics).
        local: keys (:func:`hpcrep.tensorflow.variables.variable_key`) of variables whose
            gradients stay on this rank.
        scale_local_gradients: divide local gradients by ``size`` (Horovod's default).
    """

    op: Any = ReduceOp.Average
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    num_groups: int = 0
    groups: Optional[Sequence[Sequence[Any]]] = None
    process_set: Any = None
    local: set = dataclasses.field(default_factory=set)
    scale_local_gradients: bool = True

    def __post_init__(self) -> None:
        self.op = as_reduce_op(self.op)
        if self.op not in (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum):
            raise CollectiveArgumentError(
                f"gradients can be reduced with op=Average, Sum or Adasum, got {self.op.name}")
        if self.op is ReduceOp.Adasum:
            collectives.require_global_for_adasum(self.process_set)
        if self.gradient_predivide_factor != 1.0 and self.op is not ReduceOp.Average:
            raise CollectiveArgumentError(
                "gradient_predivide_factor needs op=Average; drop the factor or use Average")
        if isinstance(self.groups, int):  # Horovod: groups=<int> is the number of groups
            self.num_groups, self.groups = self.groups, None
        if self.num_groups < 0:
            raise CollectiveArgumentError(f"num_groups must be >= 0, got {self.num_groups}")
        if self.compression is Compression.powersgd:
            raise CollectiveArgumentError(
                "compression=Compression.powersgd needs its options: call it, e.g. "
                "compression=hvd.Compression.powersgd(rank=2)")
        if is_stateful(self.compression) and (self.op is not ReduceOp.Average
                                              or self.gradient_predivide_factor != 1.0):
            raise CollectiveArgumentError(
                f"{self.compression!r} averages gradients: it needs op=Average and no "
                f"gradient_predivide_factor (got op={self.op.name}, factor "
                f"{self.gradient_predivide_factor}); drop them or use Compression.none/fp16")

    @property
    def stateful(self) -> bool:
        """Whether the compression keeps state between steps (PowerSGD)."""
        return is_stateful(self.compression)

    def build_before_reducing(self, optimizer: Any, variables: Optional[Sequence[Any]]) -> None:
        """With a stateful compression, build ``optimizer`` on ``variables`` now if it is not
        built, as Keras's ``apply`` would a little later: the state must be the optimizer's
        variables before the first exchange uses it (built lazily there it would belong to no
        optimizer, and its checkpoints would miss it). Local."""
        if self.stateful and not optimizer.built and variables is not None:
            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(list(variables))
            optimizer.built = True

    def build_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Create the compression's state, if it has any, as ``optimizer``'s variables (see
        :meth:`hpcrep.tensorflow.powersgd.PowerSGD.build`). Local."""
        if is_stateful(self.compression):
            self.compression.build(list(variables), optimizer)

    def reduce(self, grads: Sequence[Any], variables: Optional[Sequence[Any]] = None,
               name: str = "gradients") -> list[Any]:
        """Return ``grads`` reduced across ranks; ``None`` entries stay ``None``.

        ``variables`` (the gradients' sources, same order) are needed for explicit ``groups`` and
        to recognise local variables.

        Collective: every rank must call this, in the same order, with matching gradients.
        """
        grads = list(grads)
        if isinstance(self.process_set, comm.ProcessSet) and not self.process_set.included():
            return grads
        if self.local and variables is not None:
            return self._reduce_with_locals(grads, list(variables), name)
        communicator = comm.resolve(self.process_set)
        if self.sparse_as_dense:  # on any number of ranks, as Horovod
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        stateful = self.stateful
        if communicator.size() == 1 and self.op is ReduceOp.Average and not stateful:
            return grads
        out: list[Any] = list(grads)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = collectives.allreduce(g, op=self.op, name=f"{name}.sparse.{i}",
                                               process_set=communicator)
        if stateful:
            subset = None if variables is None else [variables[i] for i in dense]

            def plain(tensors: list) -> list:
                return self._reduce_dense(tensors, list(range(len(tensors))), subset,
                                          communicator, name)

            reduced = self.compression.reduce(grads, variables, plain, communicator, name)
            for i in dense:
                out[i] = reduced[i]
            return out
        reduced = self._reduce_dense(grads, dense, variables, communicator, name)
        for i, r in zip(dense, reduced):
            out[i] = r
        return out

    def _reduce_dense(self, grads: list, dense: list[int], variables: Optional[Sequence[Any]],
                      communicator: comm.Communicator, name: str) -> list[Any]:
        """Return ``grads[i]`` for ``i`` in ``dense`` reduced in fusion buckets, in that order.

        Collective: every rank of ``communicator`` must call this, in the same order.
        """
        if self.op is ReduceOp.Average and self.gradient_predivide_factor != 1.0:
            op = ReduceOp.Sum
            pre = 1.0 / self.gradient_predivide_factor
            post = self.gradient_predivide_factor / communicator.size()
        else:
            op, pre, post = self.op, 1.0, 1.0
        # During a stateful compression's warm-up its gradients travel uncompressed.
        compression = Compression.none if is_stateful(self.compression) else self.compression
        groups = self._split(dense, variables)
        overlap = config.get("HPCREP_OVERLAP")
        if not overlap and not tf.executing_eagerly():
            # One exchange after the whole backward pass: every bucket waits for every gradient.
            dense_set = set(dense)
            with tf.control_dependencies([grads[i] for i in dense]):
                grads = [tf.identity(g) if i in dense_set else g for i, g in enumerate(grads)]
        tuned = bool(dense) and not is_stateful(self.compression) and autotune.enabled()
        if tuned:
            # HPCREP_AUTOTUNE: the tuner ticks once the backward pass has made its first
            # gradient (the last one), and every bucket of the step waits for it.
            tick = autotune.tick_op(communicator, grads[dense[-1]])
            dense_set = set(dense)
            with tf.control_dependencies([tick]):
                grads = [tf.identity(g) if i in dense_set else g for i, g in enumerate(grads)]
        with autotune.tuned_scope() if tuned else contextlib.nullcontext():
            return self._exchange(grads, groups, overlap, op, pre, post, compression,
                                  communicator, name, dense)

    def _exchange(self, grads: list, groups: list[list[int]], overlap: bool, op: ReduceOp,
                  pre: float, post: float, compression: Any, communicator: comm.Communicator,
                  name: str, dense: list[int]) -> list[Any]:
        """Start each group's fused allreduce (overlap: last gradient first); return the
        reduced gradients of ``dense`` in that order. Collective."""
        out: list[Any] = list(grads)
        for gi, group in enumerate(groups):
            # Overlap: buckets are planned from the last gradient back (the backward pass makes
            # the last layer's first), so the first bucket's exchange starts while earlier
            # layers' gradients are still being computed.
            order = group[::-1] if overlap else group
            reduced = collectives.grouped_allreduce(
                [grads[i] for i in order], op=op, compression=compression,
                prescale_factor=pre, postscale_factor=post, name=f"{name}.{gi}",
                process_set=communicator)
            for i, r in zip(order, reduced):
                out[i] = r
        return [out[i] for i in dense]

    def _reduce_with_locals(self, grads: list, variables: list, name: str) -> list[Any]:
        is_local = [variable_key(v) in self.local for v in variables]
        shared = [i for i, local in enumerate(is_local) if not local]
        out = list(grads)
        reduced = GradientReducer.reduce(dataclasses.replace(self, local=set()),
                                         [grads[i] for i in shared],
                                         [variables[i] for i in shared], name)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self.scale_local_gradients:
            n = comm.resolve(self.process_set).size()
            for i, local in enumerate(is_local):
                if local and out[i] is not None:
                    out[i] = _divide(out[i], n)
        return out

    def _split(self, indices: list[int], variables: Optional[Sequence[Any]]) -> list[list[int]]:
        if self.groups is not None and variables is not None:
            position = {id(v): i for i, v in enumerate(variables)}
            chosen = [[position[id(v)] for v in grp if id(v) in position] for grp in self.groups]
            grouped = {i for grp in chosen for i in grp}
            rest = [[i] for i in indices if i not in grouped]  # each on its own, as Horovod
            return [g for g in ([i for i in grp if i in indices] for grp in chosen) if g] + rest
        if self.num_groups > 1:
            n, m = self.num_groups, len(indices)
            return [g for g in (indices[k * m // n:(k + 1) * m // n] for k in range(n)) if g]
        return [indices] if indices else []


def _divide(grad: Any, n: int) -> Any:
    """Return ``grad / n`` for a tensor or ``tf.IndexedSlices`` (values divided)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)
