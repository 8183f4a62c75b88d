"""Plain Keras: ``model.fit`` on numpy arrays with callbacks that write files.
No hpcrep training code (Fashion-MNIST comes from ``hpcrep.data``, a numpy loader of Debian's
dataset-fashion-mnist).

Writes ``OUT/best.keras`` (ModelCheckpoint), ``OUT/log.csv`` (CSVLogger) and
``OUT/final.weights.h5``.

    python jobs/transparent_fit_numpy.py --out outputs
    hpcrep run -n 4 jobs/transparent_fit_numpy.py --out outputs
"""

import argparse
import os

import keras

from hpcrep.data import fashion_mnist_split

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rows", type=int, default=8192, help="training images used (0: all 60000)")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--out", default="outputs", help="directory for checkpoint and log files")
args = parser.parse_args()

x, y = fashion_mnist_split("train", args.rows)
x = x.reshape(-1, 784).astype("float32") / 255.0
os.makedirs(args.out, exist_ok=True)

model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(keras.optimizers.SGD(args.lr, momentum=0.9), "sparse_categorical_crossentropy",
              metrics=["accuracy"])
callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(args.out, "best.keras"),
                                             monitor="val_loss", save_best_only=True),
             keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv"))]
history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_split=0.1,
                    callbacks=callbacks, verbose=2)
model.save_weights(os.path.join(args.out, "final.weights.h5"))
print(f"train loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}")
print(f"val accuracy {history.history['val_accuracy'][-1]:.4f}")
