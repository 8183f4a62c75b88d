"""The four differentiable exchanges of tensor parallelism among a replica's ranks.

Every rank of a replica runs the same step on the same batch, so a tensor outside the sharded
layers (an input, an activation after a row-parallel layer, the loss) has the same value on every
rank of the replica, and so has the upstream gradient of such a tensor. The exchanges below pair
a forward and a backward pass so that the gradients equal those of the unsharded model (Shoeybi
et al. 2019, Megatron-LM, "f" and "g"):

============================  =========================  =================================
exchange                      forward                    backward
============================  =========================  =================================
:func:`copy_to_shards`        identity                   allreduce (sum) of the gradient
:func:`reduce_from_shards`    allreduce (sum)            identity
:func:`gather_from_shards`    allgather along ``axis``   this rank's slice of the gradient
:func:`scatter_to_shards`     this rank's slice          allgather of the gradient
============================  =========================  =================================

hpcrep's own collectives have Horovod's gradients (an allreduce's gradient is an allreduce),
which would count an upstream gradient once per rank of the replica here; these functions
replace them. On a group of one rank each is the identity (no exchange). Equal slices only:
the size along ``axis`` must be the same on every rank.

Each is collective over ``group``: every rank of the replica must call it, in the same order,
with a tensor of the same shape and dtype (its backward exchange is collective in the same way).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hpcrep.comm import Communicator, ReduceOp
from hpcrep.tensorflow import collectives


def copy_to_shards(x: Any, group: Communicator, name: str = "copy_to_shards") -> tf.Tensor:
    """Identity forward; the gradient is summed over ``group`` (every shard used ``x``).

    Collective over ``group`` in the backward pass.
    """
    x = tf.convert_to_tensor(x)
    if group.size() == 1:
        return x

    @tf.custom_gradient
    def forward(t: tf.Tensor):
        def backward(dy: tf.Tensor) -> tf.Tensor:
            return collectives.allreduce(tf.convert_to_tensor(dy), op=ReduceOp.Sum,
                                         name=f"{name}.grad", process_set=group)

        return tf.identity(t), backward

    return forward(x)


def reduce_from_shards(x: Any, group: Communicator, name: str = "reduce_from_shards"
                       ) -> tf.Tensor:
    """Sum ``x`` over ``group``; the gradient passes through unchanged (it is the same on every
    rank already).

    Collective over ``group``: every rank must call this, in the same order, with the same shape.
    """
    x = tf.convert_to_tensor(x)
    if group.size() == 1:
        return x

    @tf.custom_gradient
    def forward(t: tf.Tensor):
        y = collectives.allreduce(t, op=ReduceOp.Sum, name=name, process_set=group)

        def backward(dy: tf.Tensor) -> tf.Tensor:
            return tf.identity(dy)

        return y, backward

    return forward(x)


def gather_from_shards(x: Any, group: Communicator, axis: int = -1,
                       name: str = "gather_from_shards") -> tf.Tensor:
    """Concatenate every rank's ``x`` along ``axis``, in shard order; the gradient is this
    rank's slice of the upstream gradient.

    Collective over ``group``: every rank must call this, in the same order, with the same shape.
    """
    x = tf.convert_to_tensor(x)
    k = group.size()
    if k == 1:
        return x
    me = group.rank()

    @tf.custom_gradient
    def forward(t: tf.Tensor):
        stacked = collectives.allgather(tf.expand_dims(t, 0), name=name, process_set=group)
        y = tf.concat(tf.unstack(stacked, num=k), axis=axis)

        def backward(dy: tf.Tensor) -> tf.Tensor:
            return tf.split(tf.convert_to_tensor(dy), k, axis=axis)[me]

        return y, backward

    return forward(x)


def scatter_to_shards(x: Any, group: Communicator, axis: int = -1,
                      name: str = "scatter_to_shards") -> tf.Tensor:
    """Return this rank's slice of ``x`` along ``axis`` (``size / k`` wide); the gradient is the
    slices' gradients gathered from every rank.

    Raises:
        tf.errors.InvalidArgumentError: ``x``'s size along ``axis`` is not a multiple of the
            group's size.

    Collective over ``group`` in the backward pass.
    """
    x = tf.convert_to_tensor(x)
    k = group.size()
    if k == 1:
        return x
    me = group.rank()

    @tf.custom_gradient
    def forward(t: tf.Tensor):
        def backward(dy: tf.Tensor) -> tf.Tensor:
            return gather_from_shards(tf.convert_to_tensor(dy), group, axis, f"{name}.grad")

        return tf.identity(tf.split(t, k, axis=axis)[me]), backward

    return forward(x)
