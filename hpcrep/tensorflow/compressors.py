"""Per-tensor gradient compressors (Horovod's ``Compressor`` interface): ``compress`` before the
allreduce, ``decompress`` after. The public namespace is
:class:`hpcrep.tensorflow.compression.Compression`."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Interface: ``compress`` before communication, ``decompress`` after."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Return the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """Return the received tensor in its original form."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send floating tensors as float16 (half the bytes); other dtypes pass unchanged.

    Sums are formed in float16 on the wire, so large gradients lose precision and values beyond
    65504 overflow to inf; use it for bandwidth-bound jobs with well-scaled gradients.
    """

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tf.cast(tensor, ctx) if ctx is not None else tensor
