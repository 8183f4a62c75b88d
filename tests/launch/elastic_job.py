"""A Horovod-elastic-style Keras job for tests/launch/test_elastic_resume.py and
test_elastic_relaunch.py: commits after every epoch; ``--fail-at E`` makes rank 1 raise at the
start of epoch E (the whole job then aborts); with ``--kill-once MARKER`` rank 1 SIGKILLs itself
there instead (SIGSTOP with ``--stop-once``: a hung rank), only if MARKER does not exist yet (it
creates it first), so a relaunch goes on."""

import argparse
import os
import signal
import time

import keras
import numpy as np

import hpcrep.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--kill-once", metavar="MARKER")
parser.add_argument("--stop-once", action="store_true",
                    help="with --kill-once: SIGSTOP instead of SIGKILL (a hung rank)")
parser.add_argument("--epoch-sleep", type=float, default=0.0, help="seconds after each commit")
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
    print(f"rank {hvd.rank()} starts at epoch {state.epoch} at {time.time():.3f}", flush=True)
    for epoch in range(state.epoch, args.epochs):
        if epoch == args.fail_at and hvd.rank() == 1:
            if args.kill_once is None:
                raise RuntimeError(f"injected failure at epoch {epoch}")
            if not os.path.exists(args.kill_once):
                with open(args.kill_once, "w") as f:
                    f.write(f"{time.time():.3f}\n")
                os.kill(os.getpid(), signal.SIGSTOP if args.stop_once else signal.SIGKILL)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        state.epoch = epoch + 1
        state.commit()
        if hvd.rank() == 0:
            print(f"rank 0 finished epoch {epoch} at {time.time():.3f}", flush=True)
        time.sleep(args.epoch_sleep)


train(state)
if hvd.rank() == 0:
    np.savez(args.out, *model.get_weights())
