"""Plain Keras: ``model.fit`` on a ``tf.data`` pipeline of Fashion-MNIST. No hpcrep training code
(Fashion-MNIST comes from ``hpcrep.data``'s numpy loader of Debian's dataset-fashion-mnist).

    python jobs/transparent_fit_tfdata.py                      # one process
    hpcrep run -n 4 jobs/transparent_fit_tfdata.py             # 4 ranks, transparent mode
    mpirun -n 4 python -m hpcrep jobs/transparent_fit_tfdata.py
"""

import argparse

import keras
import tensorflow as tf

from hpcrep.data import fashion_mnist_split

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", type=int, default=8192, help="training images used (0: all 60000)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

x, y = fashion_mnist_split("train", args.rows)
x = x.reshape(-1, 784).astype("float32") / 255.0
x_test, y_test = fashion_mnist_split("test", 2048)
x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x))
         .batch(args.batch_size).prefetch(tf.data.AUTOTUNE))
test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)

model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(keras.optimizers.Adam(args.lr),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(train, epochs=args.epochs, verbose=2)
loss, accuracy = model.evaluate(test, verbose=0)
print(f"train loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}")
print(f"test loss {loss:.4f} accuracy {accuracy:.4f}")
