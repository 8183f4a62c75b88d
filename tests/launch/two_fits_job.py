"""A plain Keras script with two ``fit`` calls of two different models, for the
``HPCREP_CHECKPOINT_DIR`` tests (run under ``python -m hpcrep``).

The first model (8 -> 8 -> 1) trains ``--epochs1`` epochs, the second (6 -> 16 -> 16 -> 1,
another shape) ``--epochs2``. After each ``fit`` rank 0 prints ``fitN epochs=<the History's
epochs> loss=<its losses>``. With ``--progress P`` every rank writes ``<pid> <epochs done over
both fits>`` to ``P.<MPI rank>`` after each epoch; ``--sleep S`` sleeps S seconds after each
epoch (for a test to catch the job mid-run).
"""

import argparse
import os
import time

import keras
import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs1", type=int, default=3)
parser.add_argument("--epochs2", type=int, default=2)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--progress", help="prefix of the per-rank progress files")
args = parser.parse_args()
mpi_rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
done = 0


class Progress(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        global done
        done += 1
        if args.progress:
            with open(f"{args.progress}.{mpi_rank}", "w") as f:
                f.write(f"{os.getpid()} {done}\n")
        time.sleep(args.sleep)


keras.utils.set_random_seed(3)
rng = np.random.default_rng(0)


def train(name: str, widths: list, inputs: int, epochs: int) -> None:
    x = rng.normal(size=(256, inputs)).astype("float32")
    y = np.tanh(x.sum(axis=1, keepdims=True)).astype("float32")
    model = keras.Sequential([keras.Input((inputs,))]
                             + [keras.layers.Dense(w, activation="tanh") for w in widths]
                             + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=False)
    history = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[Progress()])
    losses = ",".join(f"{v:.6f}" for v in history.history.get("loss", []))
    print(f"{name} epochs={history.epoch} loss={losses}", flush=True)


train("fit1", [8], 8, args.epochs1)
train("fit2", [16, 16], 6, args.epochs2)
