"""A Horovod-elastic-style Keras job for tests/launch/test_elastic_resume.py: commits after every
epoch; ``--fail-at E`` makes rank 1 raise at the start of epoch E (the whole job then aborts)."""

import argparse

import keras
import numpy as np

import hpcrep.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--out", required=True)
args = parser.parse_args()

hvd.init()
keras.utils.set_random_seed(hvd.rank())  # different on every rank until the first sync
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss="mse")
state = hvd.elastic.KerasState(model, epoch=0)
rng = np.random.default_rng(100 + hvd.rank())
x = rng.normal(size=(32, 3)).astype("float32")
y = x.sum(axis=1, keepdims=True)


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} starts at epoch {state.epoch}", flush=True)
    for epoch in range(state.epoch, args.epochs):
        if epoch == args.fail_at and hvd.rank() == 1:
            raise RuntimeError(f"injected failure at epoch {epoch}")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        state.epoch = epoch + 1
        state.commit()


train(state)
if hvd.rank() == 0:
    np.savez(args.out, *model.get_weights())
