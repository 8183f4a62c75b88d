"""Plain TensorFlow: a custom ``GradientTape`` loop with a ``tf.function`` step.
No hpcrep training code (Fashion-MNIST comes from ``hpcrep.data``, a numpy loader of Debian's
dataset-fashion-mnist).

Logistic regression / small MLP on Fashion-MNIST, iterating a ``tf.data`` dataset in Python.

    python jobs/transparent_custom_loop.py
    hpcrep run -n 4 jobs/transparent_custom_loop.py
"""

import argparse
import time

import keras
import tensorflow as tf

from hpcrep.data import fashion_mnist_split

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", type=int, default=4096, help="training images used (0: all 60000)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()

x, y = fashion_mnist_split("train", args.rows)
x = x.reshape(-1, 784).astype("float32") / 255.0
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)

model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(args.lr, momentum=0.9)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer.build(model.trainable_variables)


@tf.function
def train_step(x_batch, y_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(y_batch, model(x_batch, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


losses = []
for epoch in range(args.epochs):
    start, total, steps = time.perf_counter(), 0.0, 0
    for x_batch, y_batch in dataset:
        total += float(train_step(x_batch, y_batch))
        steps += 1
    losses.append(total / steps)
    print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}, "
          f"{(time.perf_counter() - start) / steps * 1e3:.2f} ms/step")
print(f"train loss {losses[0]:.4f} -> {losses[-1]:.4f}")
