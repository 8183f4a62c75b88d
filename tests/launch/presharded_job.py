"""A plain Keras script over hpcrep's own HDF5 input (already this rank's shard), run under
``python -m hpcrep``: records which rows, by their id column, a Python loop and ``model.fit`` saw
on this rank in each epoch.

    presharded_job.py FILE.h5 OUT --batch B --epochs E

``FILE.h5`` holds datasets ``x`` (features), ``y`` (targets) and ``id`` (a unique id per row).
Writes ``OUT/rank<rank>.json``: ``{"loop": [ids per epoch], "fit": [ids per epoch],
"fit_steps": [steps per epoch]}``.
"""

import argparse
import json
import os

import keras
import tensorflow as tf

import hpcrep.comm as hc
from hpcrep.tensorflow.hdf5_dataset import hdf5_dataset

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("file")
parser.add_argument("out")
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

dataset = hdf5_dataset(args.file, ["x", "y", "id"], args.batch, seed=1)

# (a) a custom loop: iterate the dataset in Python, once per epoch
loop = []
for _epoch in range(args.epochs):
    seen = []
    for _x, _y, ids in dataset:
        seen += ids.numpy().tolist()
    loop.append(seen)

# (b) model.fit on a dataset derived from it (map keeps tf.data's options)
fit_ids: list[list[int]] = []
fit_steps: list[int] = []


class IdRecorder(keras.Model):
    """A linear model of ``x`` that records the ids of the rows it trains on (run eagerly)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = keras.layers.Dense(1)

    def call(self, inputs, training=None):
        ids = inputs["id"]
        if training and isinstance(ids, tf.Tensor) and tf.executing_eagerly():
            fit_ids[-1].extend(ids.numpy().tolist())
        return self.head(inputs["x"])


class Epochs(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        fit_ids.append([])
        fit_steps.append(0)

    def on_train_batch_end(self, batch, logs=None):
        fit_steps[-1] += 1


model = IdRecorder()
model.compile(keras.optimizers.SGD(0.01), "mse", run_eagerly=True)
model.fit(dataset.map(lambda x, y, ids: ({"x": x, "id": ids}, y)), epochs=args.epochs,
          callbacks=[Epochs()], verbose=0)

with open(os.path.join(args.out, f"rank{hc.rank()}.json"), "w") as f:
    json.dump({"loop": loop, "fit": fit_ids, "fit_steps": fit_steps}, f)
print(f"rank {hc.rank()}: loop saw {[len(e) for e in loop]} rows, fit ran {fit_steps} steps")
