"""Batch normalisation with statistics over the global batch of all ranks."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow.collectives import grouped_allreduce


def global_moments(x: tf.Tensor, axes: Any, mask: Any = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Return mean and variance of ``x`` over ``axes`` and over every rank's ``x``.

    One fused allreduce carries the element count, the sum and the sum of squares. The variance
    is E[x^2] - E[x]^2 computed in float32 (inputs are upcast); for activations with a large mean
    relative to their spread this loses precision, which batch-norm's epsilon absorbs. Gradients
    flow through the allreduce to every rank's inputs.

    Collective: every rank must call this, in the same order (in training steps).
    """
    x = tf.cast(x, tf.float32)
    if mask is None:
        weights = tf.ones_like(x)
    else:
        weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
    count = tf.reduce_sum(weights, axis=axes)
    total = tf.reduce_sum(x * weights, axis=axes)
    squares = tf.reduce_sum(tf.square(x) * weights, axis=axes)
    count, total, squares = grouped_allreduce([count, total, squares], op=ReduceOp.Sum,
                                              name="sync_batch_norm")
    count = tf.maximum(count, 1.0)
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return mean, variance


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics span all ranks.

    Same arguments as the Keras layer (``synchronized`` is ignored: this layer always syncs over
    MPI, inside or outside ``tf.distribute``). With one rank it is exactly the Keras layer.
    Moving statistics are computed from the global moments, so they stay equal on every rank.

    Horovod's ``fused=False`` (its default) is accepted and ignored: Keras 3 has no fused
    kernel, so the layer never fuses; ``fused=True`` or ``None`` raises ``ValueError``, as in
    Horovod, which cannot synchronise a fused batch norm either.
    """

    def __init__(self, *args: Any, fused: Any = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise CollectiveArgumentError(
                f"SyncBatchNormalization does not support fused={fused} (as in Horovod); pass "
                "fused=False or leave it out.")
        kwargs.pop("synchronized", None)
        super().__init__(*args, **kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if comm.size() == 1:
            return super()._moments(inputs, mask)
        return global_moments(inputs, self._reduction_axes, mask)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("synchronized", None)
        return config
