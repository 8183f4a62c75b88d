"""ResNet-50 classification (He et al. 2016) trained as in Goyal et al. (2017).

SGD with momentum 0.9; the learning rate is ``base_lr x global_batch / 256`` and ramps linearly
from ``1/size`` of that over the warm-up, the formula of
:class:`hpcrep.tensorflow.keras.callbacks.LearningRateWarmupCallback`. The training step is one
compiled function written with the public API: forward and backward under a
``hvd.DistributedGradientTape``, whose ``gradient()`` averages across ranks, then the update.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

import hpcrep.tensorflow as hvd


def resnet50(image_size: int = 224, channels: int = 3, classes: int = 1000) -> keras.Model:
    """Return ``keras.applications.ResNet50(weights=None)`` for ``image_size`` inputs (>= 32)."""
    if image_size < 32:
        raise ValueError(f"ResNet-50 needs images of at least 32x32, got {image_size}")
    return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, channels),
                                       classes=classes)


def small_resnet(input_shape: Sequence[int] = (28, 28, 1), classes: int = 10, width: int = 16,
                 stages: int = 2) -> keras.Model:
    """Return a small ResNet-style net (bottleneck-free basic blocks) for quick convergence checks.

    Same ingredients as ResNet-50 (conv stem, residual blocks with batch norm, projection
    shortcuts when the shape changes, global average pooling, softmax) at a size that trains on
    two CPU cores in seconds.
    """
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(momentum=0.9)(x))
    for stage in range(stages):
        filters, stride = width * 2 ** stage, 1 if stage == 0 else 2
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization(momentum=0.9)(y))
        y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = keras.layers.BatchNormalization(momentum=0.9)(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = keras.layers.BatchNormalization(momentum=0.9)(shortcut)
        x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="small_resnet")


def scaled_learning_rate(base_lr: float, global_batch: int, reference_batch: int = 256) -> float:
    """Goyal et al.'s linear scaling rule: ``base_lr x global_batch / reference_batch``."""
    return base_lr * global_batch / reference_batch


def warmup_learning_rate(step: int, warmup_steps: int, peak_lr: float, ranks: int) -> float:
    """Learning rate at ``step``: from ``peak_lr / ranks`` linearly up to ``peak_lr``.

    The formula of ``LearningRateWarmupCallback.rate_at`` in steps instead of epochs.
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak_lr
    return peak_lr / ranks * (step / warmup_steps * (ranks - 1) + 1)


def scheduled_learning_rate(step: int, warmup_steps: int, total_steps: int, peak_lr: float,
                            ranks: int) -> float:
    """Warm-up (:func:`warmup_learning_rate`), then cosine decay from ``peak_lr`` to 0 at
    ``total_steps``. Without a decay, the last weights of a short run are those of the peak rate
    and the batch-norm statistics they are evaluated with lag behind them."""
    if step < warmup_steps or total_steps <= warmup_steps:
        return warmup_learning_rate(step, warmup_steps, peak_lr, ranks)
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class Classifier:
    """A Keras classifier trained with SGD + momentum by one compiled data-parallel step.

    ``distributed_tape`` wraps the recorded tape of each step (default
    ``hvd.DistributedGradientTape``; the benchmark passes its variants, :mod:`bench.variants`).
    """

    def __init__(self, model: keras.Model, learning_rate: float, momentum: float = 0.9,
                 weight_decay: float = 0.0,
                 distributed_tape: Optional[Callable[[tf.GradientTape], Any]] = None) -> None:
        self.model = model
        self.optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum)
        self.optimizer.build(model.trainable_variables)
        self.weight_decay = weight_decay
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy()
        self.train_step = self.compile_step(distributed_tape)

    @property
    def variables(self) -> list:
        """Model weights and optimizer state: what ranks must agree on at the start."""
        return list(self.model.variables) + list(self.optimizer.variables)

    def set_learning_rate(self, value: float) -> None:
        """Set the optimizer's learning rate (a variable: no retracing)."""
        self.optimizer.learning_rate.assign(value)

    def compile_step(self, distributed_tape: Optional[Callable[[tf.GradientTape], Any]] = None
                     ) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
        """Return the compiled training step ``(images, labels) -> loss`` with
        ``distributed_tape`` (default ``hvd.DistributedGradientTape``) averaging the gradients.

        Collective (the step): every rank must call it, in the same order.
        """
        wrap = distributed_tape or hvd.DistributedGradientTape

        def step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = self.loss_fn(labels, self.model(images, training=True))
                if self.weight_decay:
                    loss += self.weight_decay * tf.add_n(
                        [tf.nn.l2_loss(v) for v in self.model.trainable_variables if v.ndim > 1])
            tape = wrap(tape)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply(grads, self.model.trainable_variables)
            return loss

        return tf.function(step)

    def accuracy(self, images, labels, batch: int = 500) -> float:
        """Top-1 accuracy of the model in inference mode on numpy ``images``/``labels``."""
        predict = tf.function(lambda x: tf.argmax(self.model(x, training=False), axis=-1))
        correct = 0
        for i in range(0, len(images), batch):
            correct += int(tf.reduce_sum(tf.cast(
                predict(images[i:i + batch]) == tf.cast(labels[i:i + batch], tf.int64), tf.int32)))
        return correct / len(images)
