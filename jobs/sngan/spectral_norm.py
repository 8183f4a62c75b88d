"""Spectral normalisation (Miyato et al. 2018) that divides by sigma in the forward pass.

``keras.layers.SpectralNormalization`` overwrites the kernel in place, so no gradient flows
through sigma (and wrapping an ``Embedding`` breaks). These layers keep the raw kernel as the
trainable variable and use ``kernel / sigma(kernel)`` in every forward pass, with sigma estimated
by power iteration from a persistent, non-trainable vector ``u`` that is updated only in training.
As in the paper, ``u`` and ``v`` are treated as constants for the gradient (``stop_gradient``),
so the gradient of sigma is ``u v^T``.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


class _SpectralNormalized(keras.layers.Layer):
    """Base class: subclasses create ``self.kernel`` whose last axis is the output axis."""

    def __init__(self, power_iterations: int = 1, epsilon: float = 1e-12, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if power_iterations < 1:
            raise ValueError(f"power_iterations must be >= 1, got {power_iterations}")
        self.power_iterations = power_iterations
        self.epsilon = epsilon

    def _make_u(self, out_dim: int) -> None:
        self.u = self.add_weight(name="sn_u", shape=(1, out_dim), trainable=False,
                                 initializer=keras.initializers.RandomNormal(stddev=1.0))

    def normalized_kernel(self, training: bool) -> tf.Tensor:
        """Return ``kernel / sigma``; in training, also store the new power-iteration vector."""
        w = tf.reshape(self.kernel, (-1, self.kernel.shape[-1]))  # (in, out)
        u = tf.convert_to_tensor(self.u)
        for _ in range(self.power_iterations):
            v = tf.math.l2_normalize(tf.matmul(u, w, transpose_b=True), epsilon=self.epsilon)
            u = tf.math.l2_normalize(tf.matmul(v, w), epsilon=self.epsilon)
        u, v = tf.stop_gradient(u), tf.stop_gradient(v)
        sigma = tf.reduce_sum(tf.matmul(v, w) * u)
        if training:
            self.u.assign(u)
        return self.kernel / sigma

    def sigma(self) -> float:
        """The current estimate of the kernel's largest singular value (no update)."""
        w = tf.reshape(self.kernel, (-1, self.kernel.shape[-1]))
        v = tf.math.l2_normalize(tf.matmul(self.u, w, transpose_b=True))
        return float(tf.reduce_sum(tf.matmul(v, w) * tf.math.l2_normalize(self.u)))


class SNDense(_SpectralNormalized):
    """Dense layer with a spectrally normalised kernel."""

    def __init__(self, units: int, use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units, self.use_bias = units, use_bias

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.units,),
                                    initializer="zeros") if self.use_bias else None
        self._make_u(self.units)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        y = tf.matmul(x, self.normalized_kernel(training))
        return y + self.bias if self.bias is not None else y


class SNConv2D(_SpectralNormalized):
    """2-D convolution (NHWC, 'same' padding) with a spectrally normalised kernel."""

    def __init__(self, filters: int, kernel_size: int = 3, use_bias: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters, self.kernel_size, self.use_bias = filters, kernel_size, use_bias

    def build(self, input_shape: Any) -> None:
        k = self.kernel_size
        self.kernel = self.add_weight(name="kernel", shape=(k, k, input_shape[-1], self.filters),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.filters,),
                                    initializer="zeros") if self.use_bias else None
        self._make_u(self.filters)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        y = tf.nn.conv2d(x, self.normalized_kernel(training), strides=1, padding="SAME")
        return y + self.bias if self.bias is not None else y


class SNEmbedding(_SpectralNormalized):
    """Class embedding (a ``classes x dim`` matrix) with spectral normalisation, as in the
    projection discriminator."""

    def __init__(self, classes: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.classes, self.dim = classes, dim

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(name="embeddings", shape=(self.classes, self.dim),
                                      initializer="glorot_uniform")
        self._make_u(self.dim)

    def call(self, labels: tf.Tensor, training: bool = False) -> tf.Tensor:
        return tf.gather(self.normalized_kernel(training), labels)
