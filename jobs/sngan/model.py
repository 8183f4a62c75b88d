"""Class-conditional SN-GAN: Miyato & Koyama (2018), *cGANs with Projection Discriminator*.

- Generator: ResNet blocks (BN-ReLU-up-conv-BN-ReLU-conv, shortcut up-conv1x1) whose batch norms
  are *conditional* (per-class gain and bias) over statistics of every replica's batch: with
  ``sync=True`` the normalisation is :class:`hpcrep.replicator.CrossReplicaBatchNormalization`
  (one fused allreduce of count, sum and sum of squares per layer).
- Discriminator: ResNet blocks with spectrally normalised convolutions, global sum pooling, a
  linear output plus the projection term ``<embed(y), h>``.
- Hinge loss; Adam(2e-4, beta1=0, beta2=0.9); ``n_dis`` discriminator updates per generator update.
- Distributed as TF-Replicator does it: variables created in ``Replicator.scope()``, optimizers
  from ``Replicator.wrap_optimizer`` (gradients averaged over the replicas in ``apply``), each
  update one ``Replicator.run`` of a single-replica step inside ``tf.function``.

Widths are parameters: the paper's 32x32 model is G 256 / D 128 channels; ``ch=32..64`` is the
CPU-sized variant.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from hpcrep.replicator import CrossReplicaBatchNormalization, Replicator
from jobs.sngan.spectral_norm import SNConv2D, SNDense, SNEmbedding


class ConditionalBatchNorm(keras.layers.Layer):
    """Batch norm whose gain and bias are looked up per class; ``classes=0`` is unconditional.

    The normalisation (batch moments, moving statistics) is
    :class:`~hpcrep.replicator.CrossReplicaBatchNormalization` with ``sync`` (statistics of every
    replica's batch; in training it must run inside ``Replicator.run``, and is collective there),
    else Keras's own (this replica's batch only).
    """

    def __init__(self, classes: int = 0, sync: bool = True, momentum: float = 0.9,
                 epsilon: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.classes, self.sync = classes, sync
        norm = CrossReplicaBatchNormalization if sync else keras.layers.BatchNormalization
        self.norm = norm(momentum=momentum, epsilon=epsilon, center=False, scale=False)

    def build(self, input_shape: Any) -> None:
        c, rows = input_shape[-1], max(self.classes, 1)
        self.gamma = self.add_weight(name="gamma", shape=(rows, c), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(rows, c), initializer="zeros")
        self.norm.build(input_shape)

    def call(self, x: tf.Tensor, labels: Optional[tf.Tensor] = None,
             training: bool = False) -> tf.Tensor:
        x_hat = self.norm(x, training=training)
        if self.classes:
            gamma = tf.gather(self.gamma, labels)[:, None, None, :]
            beta = tf.gather(self.beta, labels)[:, None, None, :]
        else:
            gamma, beta = self.gamma[0], self.beta[0]
        return x_hat * gamma + beta


def _upsample(x: tf.Tensor) -> tf.Tensor:
    return tf.repeat(tf.repeat(x, 2, axis=1), 2, axis=2)


def _downsample(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.avg_pool2d(x, 2, 2, "VALID")


class GBlock(keras.layers.Layer):
    """Generator residual block that doubles the resolution."""

    def __init__(self, filters: int, classes: int, sync: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bn1 = ConditionalBatchNorm(classes, sync)
        self.bn2 = ConditionalBatchNorm(classes, sync)
        self.conv1 = keras.layers.Conv2D(filters, 3, padding="same")
        self.conv2 = keras.layers.Conv2D(filters, 3, padding="same")
        self.skip = keras.layers.Conv2D(filters, 1)

    def call(self, x: tf.Tensor, labels: tf.Tensor, training: bool = False) -> tf.Tensor:
        h = tf.nn.relu(self.bn1(x, labels, training=training))
        h = self.conv1(_upsample(h))
        h = self.conv2(tf.nn.relu(self.bn2(h, labels, training=training)))
        return h + self.skip(_upsample(x))


class Generator(keras.Model):
    """ResNet generator: z (and class) -> image in [-1, 1] of ``image_size`` (a power of 2 >= 8)."""

    def __init__(self, image_size: int = 32, channels: int = 3, classes: int = 10, ch: int = 64,
                 z_dim: int = 128, sync: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        blocks = int(math.log2(image_size // 4))
        if 4 * 2 ** blocks != image_size or blocks < 1:
            raise ValueError("image_size must be 4 x a power of 2 (8, 16, 32, ...), "
                             f"got {image_size}")
        self.z_dim, self.classes, self.ch = z_dim, classes, ch
        self.dense = keras.layers.Dense(4 * 4 * ch)
        self.blocks = [GBlock(ch, classes, sync) for _ in range(blocks)]
        self.bn = ConditionalBatchNorm(0, sync)
        self.out = keras.layers.Conv2D(channels, 3, padding="same")

    def call(self, z: tf.Tensor, labels: tf.Tensor, training: bool = False) -> tf.Tensor:
        h = tf.reshape(self.dense(z), (-1, 4, 4, self.ch))
        for block in self.blocks:
            h = block(h, labels, training=training)
        return tf.tanh(self.out(tf.nn.relu(self.bn(h, training=training))))


class DBlock(keras.layers.Layer):
    """Discriminator residual block (spectrally normalised), optionally halving the resolution."""

    def __init__(self, filters: int, downsample: bool, first: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.downsample, self.first = downsample, first
        self.conv1 = SNConv2D(filters, 3)
        self.conv2 = SNConv2D(filters, 3)
        self.skip = SNConv2D(filters, 1)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        h = x if self.first else tf.nn.relu(x)  # the first ("optimized") block has no pre-ReLU
        h = self.conv2(tf.nn.relu(self.conv1(h, training=training)), training=training)
        if self.first:
            return _downsample(h) + self.skip(_downsample(x), training=training)
        skip = self.skip(x, training=training)
        if self.downsample:
            h, skip = _downsample(h), _downsample(skip)
        return h + skip


class Discriminator(keras.Model):
    """Projection discriminator: ``psi(phi(x)) + <embed(y), phi(x)>``."""

    def __init__(self, classes: int = 10, ch: int = 64, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.blocks = [DBlock(ch, True, first=True), DBlock(ch, True), DBlock(ch, False),
                       DBlock(ch, False)]
        self.linear = SNDense(1)
        self.embed = SNEmbedding(classes, ch)

    def call(self, x: tf.Tensor, labels: tf.Tensor, training: bool = False) -> tf.Tensor:
        h = x
        for block in self.blocks:
            h = block(h, training=training)
        h = tf.reduce_sum(tf.nn.relu(h), axis=[1, 2])
        out = self.linear(h, training=training)[:, 0]
        return out + tf.reduce_sum(self.embed(labels, training=training) * h, axis=1)


def d_hinge_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
    """Discriminator hinge loss: E[relu(1 - D(x))] + E[relu(1 + D(G(z)))]."""
    return (tf.reduce_mean(tf.nn.relu(1.0 - real_logits))
            + tf.reduce_mean(tf.nn.relu(1.0 + fake_logits)))


def g_hinge_loss(fake_logits: tf.Tensor) -> tf.Tensor:
    """Generator hinge loss: -E[D(G(z))]."""
    return -tf.reduce_mean(fake_logits)


class SNGAN:
    """Generator, discriminator, their Adam optimizers and the replicated updates.

    Args:
        replicator: runs every update (one replica per rank).
        data: ``input_fn`` of the real images: ``ctx -> tf.data.Dataset`` of (images, labels)
            batches of ``batch`` for replica ``ctx.replica_id``, repeated.
        sync: batch-norm statistics across replicas (``False``: each replica's own).
        wrap_optimizer: turns each Adam into one that averages gradients over the replicas;
            default ``replicator.wrap_optimizer`` (the benchmark passes its variants,
            :mod:`bench.variants`).

    Creating it is collective (``Replicator.scope``): every rank must, in the same order.
    """

    def __init__(self, replicator: Replicator, data: Callable[[Any], tf.data.Dataset],
                 image_size: int = 32, channels: int = 3, classes: int = 10, g_ch: int = 64,
                 d_ch: int = 64, z_dim: int = 128, batch: int = 64, sync: bool = True,
                 n_dis: int = 5, lr: float = 2e-4, beta_1: float = 0.0, beta_2: float = 0.9,
                 wrap_optimizer: Optional[Callable[[Any], Any]] = None) -> None:
        if n_dis < 1:
            raise ValueError(f"n_dis must be >= 1, got {n_dis}")
        self.classes, self.z_dim, self.batch, self.n_dis = classes, z_dim, batch, n_dis
        self.replicator = replicator
        wrap = wrap_optimizer or replicator.wrap_optimizer
        with replicator.scope():  # every replica starts from replica 0's variables
            self.generator = Generator(image_size, channels, classes, g_ch, z_dim, sync)
            self.discriminator = Discriminator(classes, d_ch)
            z, y = tf.zeros((2, z_dim)), tf.zeros((2,), tf.int32)
            self.discriminator(self.generator(z, y), y)  # build the variables
            self.g_opt = wrap(keras.optimizers.Adam(lr, beta_1=beta_1, beta_2=beta_2))
            self.d_opt = wrap(keras.optimizers.Adam(lr, beta_1=beta_1, beta_2=beta_2))
            self.g_opt.build(self.generator.trainable_variables)
            self.d_opt.build(self.discriminator.trainable_variables)

        def input_fn(ctx: Any) -> tf.data.Dataset:  # its own function: its own iterator
            return data(ctx)

        run = replicator.run
        self.update_d = tf.function(autograph=False, func=lambda: run(self._d_step, input_fn))
        self.update_g = tf.function(autograph=False, func=lambda: run(self._g_step))
        self.sample = tf.function(lambda z, y: self.generator(z, y, training=False),
                                  autograph=False)

    @property
    def variables(self) -> list:
        """Every variable (weights, u vectors, batch-norm statistics, optimizer state)."""
        return (list(self.generator.variables) + list(self.discriminator.variables)
                + list(self.g_opt.variables) + list(self.d_opt.variables))

    def _fake(self) -> tuple[tf.Tensor, tf.Tensor]:
        z = tf.random.normal((self.batch, self.z_dim))
        y = tf.random.uniform((self.batch,), 0, self.classes, tf.int32)
        return self.generator(z, y, training=True), y

    def _d_step(self, batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        """One replica's discriminator update on its real ``batch``; returns its loss."""
        images, labels = batch
        fake, fake_y = self._fake()
        with tf.GradientTape() as tape:
            loss = d_hinge_loss(self.discriminator(images, labels, training=True),
                                self.discriminator(tf.stop_gradient(fake), fake_y, training=True))
        variables = self.discriminator.trainable_variables
        self.d_opt.apply(tape.gradient(loss, variables), variables)
        return loss

    def _g_step(self) -> tf.Tensor:
        """One replica's generator update; returns its loss."""
        with tf.GradientTape() as tape:
            fake, fake_y = self._fake()
            loss = g_hinge_loss(self.discriminator(fake, fake_y, training=False))
        variables = self.generator.trainable_variables
        self.g_opt.apply(tape.gradient(loss, variables), variables)
        return loss

    def train_step(self) -> tuple[float, float]:
        """One generator update after ``n_dis`` discriminator updates; returns this replica's
        (d_loss, g_loss).

        Collective: every rank must call this, in the same order.
        """
        for _ in range(self.n_dis):
            d_loss = self.update_d()
        g_loss = self.update_g()
        (d_loss,), (g_loss,) = (self.replicator.local_results(d_loss),
                                self.replicator.local_results(g_loss))
        return float(d_loss), float(g_loss)
