"""Making variables and Python objects equal on every rank."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import keras
import tensorflow as tf

from hpcrep import comm
from hpcrep.errors import CollectiveArgumentError, ExecutionModeError
from hpcrep.tensorflow.collectives import grouped_broadcast


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set: Any = None,
                        inplace: bool = False) -> Any:
    """Assign rank ``root_rank``'s values to ``variables`` on every rank (one fused exchange).

    Works eagerly and inside ``tf.function``; returns the grouped assign op. Over a
    communicator of one rank that is its own root, nothing moves and nothing is copied (a
    fused exchange would hold two more copies of every variable for a moment: a sharded
    embedding table's shard, whose data-parallel communicator is one rank when the replica
    spans the job).

    Collective: every rank must call this, in the same order, with the same variables.
    """
    variables = list(variables)
    if not variables:
        return tf.no_op()
    communicator = comm.resolve(process_set)
    if communicator.size() == 1 and root_rank == communicator.ranks[0]:
        return tf.no_op()
    values = grouped_broadcast([v.value() if hasattr(v, "value") and callable(v.value)
                                else tf.convert_to_tensor(v) for v in variables], root_rank,
                               name="broadcast_variables", process_set=process_set)
    return tf.group(*[v.assign(x) for v, x in zip(variables, values)])


def broadcast_global_variables(root_rank: int) -> Any:
    """Return an op that assigns rank ``root_rank``'s values to every global variable of the
    default TF1 graph (``tf.compat.v1.global_variables()``): Horovod's graph-mode helper, to run
    in the session after the initializer.

    Collective: every rank must build and run it, in the same order, with the same variables.

    Raises:
        ExecutionModeError: called eagerly (a ``RuntimeError``, as in Horovod); there, use
            :func:`broadcast_variables` with the model's and optimizer's variables.
    """
    if tf.executing_eagerly():
        raise ExecutionModeError(
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_(variables: Iterable[Any], root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> list[tf.Tensor]:
    """Assign rank ``root_rank``'s values to ``variables`` in place; return their new values.

    Horovod's in-place broadcast: one fused exchange, then each variable holds the root's value.
    Works eagerly and inside ``tf.function`` (the returned reads follow the assignment).

    Collective: every rank must call this, in the same order, with the same variables.
    """
    variables = list(variables)
    assigned = broadcast_variables(variables, root_rank, process_set)
    with tf.control_dependencies([assigned]):
        return [tf.identity(tf.convert_to_tensor(v)) for v in variables]


def variable_key(variable: Any) -> Any:
    """Return a hashable identity of a variable that a Keras variable and its ``tf.Variable`` share.

    Used to recognise registered local variables among gradients' sources. Local.
    """
    backing = getattr(variable, "_value", variable) if isinstance(variable, keras.Variable) \
        else variable
    return backing.ref() if hasattr(backing, "ref") else id(backing)


def local_layer_variables(local_layers: Any) -> list[Any]:
    """Return the trainable weights of ``local_layers`` (a layer, a list of layers, or None).

    Raises:
        CollectiveArgumentError: an entry is not a ``keras.layers.Layer``.
    """
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    bad = [type(layer).__name__ for layer in local_layers
           if not isinstance(layer, keras.layers.Layer)]
    if bad:
        raise CollectiveArgumentError(
            f"local_layers must be Keras layers (keras.layers.Layer); got {', '.join(bad)}. Pass "
            "the layers whose weights stay on each rank, or register variables one by one.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None, process_set: Any = None) -> Any:
    """Return rank ``root_rank``'s Python object on every rank (pickled).

    Collective: every rank must call this, in the same order.
    """
    return comm.broadcast_object(obj, root_rank, process_set)


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: Any = None) -> list:
    """Return every rank's Python object, in rank order (pickled).

    Collective: every rank must call this, in the same order.
    """
    return comm.allgather_object(obj, process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: Any = None) -> Any:
    """Horovod compatibility: return a function that broadcasts its argument from ``root_rank``."""
    return lambda obj: broadcast_object(obj, root_rank, process_set=process_set)
