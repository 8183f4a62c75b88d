"""DistributedGradientTape: a GradientTape whose ``gradient`` averages across ranks."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import keras
import tensorflow as tf

from hpcrep.comm.ops import ReduceOp
from hpcrep.tensorflow.compression import Compression
from hpcrep.tensorflow.gradients import GradientReducer
from hpcrep.tensorflow.timeline import mark_step
from hpcrep.tensorflow.variables import local_layer_variables, variable_key


class _DistributedGradientTape(tf.GradientTape):
    """Shares the recorded tape of the user's ``tf.GradientTape`` and reduces its gradients."""

    def __init__(self, tape: tf.GradientTape, reducer: GradientReducer) -> None:
        super().__init__(persistent=tape._persistent,
                         watch_accessed_variables=tape._watch_accessed_variables)
        self._tape = tape._tape
        self._watched_variables = tape._watched_variables
        self._hpcrep_reducer = reducer

    def register_local_source(self, source: Any) -> None:
        """Keep ``source``'s gradient on this rank (not exchanged), as Horovod's tape does.

        With ``scale_local_gradients=True`` (the default, as in Horovod) that gradient is divided
        by ``size``. Local: each rank registers its own sources, the same ones on every rank.
        """
        self._hpcrep_reducer.local.add(variable_key(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
                 use_generic_names: bool = False) -> Any:
        """Return the gradients of ``target`` with respect to ``sources``, averaged across ranks.

        ``use_generic_names`` (Horovod's op naming) is accepted and ignored.

        Collective: every rank must call this, in the same order, with matching sources.
        """
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._hpcrep_reducer.reduce(flat, tf.nest.flatten(sources), name="tape")
        mark_step("gradient", "end", after=reduced)  # the timeline's step boundary
        return tf.nest.pack_sequence_as(grads, reduced)


    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False
                                       ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """Return ``(local, global)`` lists of ``(source, gradient)`` pairs, as Horovod's tape:
        :meth:`gradient`'s results split into registered local sources and the others.

        Collective: every rank must call this, in the same order, with matching sources.
        """
        sources = list(sources)
        grads = self.gradient(target, sources, output_gradients)
        local = self._hpcrep_reducer.local
        pairs = list(zip(sources, grads))
        return ([p for p in pairs if variable_key(p[0]) in local],
                [p for p in pairs if variable_key(p[0]) not in local])


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "",
                            compression: Any = Compression.none,
                            sparse_as_dense: bool = False, op: Any = ReduceOp.Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wrap a recorded ``tf.GradientTape`` so that ``gradient()`` averages across ranks.

    Use it after the ``with tf.GradientTape() as tape:`` block, as in Horovod. With
    ``process_set`` the gradients are averaged over that set; ranks outside it get their own.
    ``device_*`` are accepted and ignored (hpcrep reduces on the host).

    ``compression=hvd.Compression.powersgd(...)`` keeps state between steps in the object
    itself: create it once, outside the step, and pass the same object every step; call its
    ``build(model.trainable_variables, optimizer)`` before the first step so that the optimizer
    carries the state into checkpoints (:mod:`hpcrep.tensorflow.powersgd`).
    """
    return _DistributedGradientTape(gradtape, GradientReducer(
        op=op, compression=compression, sparse_as_dense=sparse_as_dense, num_groups=num_groups,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients))


def PartialDistributedGradientTape(gradtape: tf.GradientTape, *,
                                   local_layers: Optional[Union[keras.layers.Layer,
                                                                Iterable[Any]]] = None,
                                   **options: Any) -> tf.GradientTape:
    """A :func:`DistributedGradientTape` that keeps the gradients of ``local_layers`` local.

    The trainable weights of each layer in ``local_layers`` are registered with
    ``register_local_source``. ``options`` are :func:`DistributedGradientTape`'s keyword
    arguments (``compression``, ``op``, ``process_set``, ``scale_local_gradients``, ...); unlike
    Horovod's, this function takes them by keyword only.

    Raises:
        CollectiveArgumentError: ``local_layers`` holds something that is not a Keras layer.
    """
    local = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, **options)
    for variable in local:
        tape.register_local_source(variable)
    return tape
