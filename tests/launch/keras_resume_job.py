"""A Keras ``fit`` job that protects itself the ways Keras users do, for the kill/resume tests.

``--protect backup``: ``keras.callbacks.BackupAndRestore(DIR)``. ``--protect modelcheckpoint``:
``ModelCheckpoint(DIR/ckpt-{epoch}.weights.h5)``, and at start ``model.load_weights`` of the
newest one with ``fit(initial_epoch=...)``. ``--protect none``: nothing (``HPCREP_CHECKPOINT_DIR``
does it). With ``--api transparent`` (run under ``python -m hpcrep``) the script is plain Keras;
``--api explicit`` uses ``hpcrep.tensorflow.keras`` as a Horovod user would.

Deterministic: op determinism, fixed seeds, ``shuffle=False``. Writes OUT/final.weights.h5 (rank
0), OUT/log.csv, and with ``--dump-start`` OUT/start.weights.h5 (the state fit starts from, after
any restore); prints ``weights-digest <sha256>`` (model and optimizer variables) and
``learning-rate <the rate the optimizer trained at>`` to stderr on every rank at the end. Each rank
writes ``<pid> <epochs done>`` to PROGRESS.<MPI rank> after every epoch (for the test to kill it).
"""

import argparse
import glob
import hashlib
import os
import re
import sys
import time

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--protect", choices=("backup", "modelcheckpoint", "none"), required=True)
parser.add_argument("--api", choices=("transparent", "explicit"), default="transparent")
parser.add_argument("--dir", required=True, help="backup / checkpoint directory")
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--rows", type=int, default=512)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep after each epoch")
parser.add_argument("--progress", help="prefix of the per-rank progress files")
parser.add_argument("--keep-backup", action="store_true", help="BackupAndRestore keeps its files")
parser.add_argument("--dump-start", action="store_true")
args = parser.parse_args()

if args.api == "explicit":
    import hpcrep.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
else:
    rank, size = 0, 1  # the script itself knows nothing of ranks
mpi_rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))

tf.config.experimental.enable_op_determinism()
keras.utils.set_random_seed(7)
rng = np.random.default_rng(0)
x = rng.normal(size=(args.rows, 8)).astype("float32")
y = (np.tanh(x @ np.linspace(-1, 1, 8)[:, None]) + 0.1 * x[:, :1] ** 2).astype("float32")
x, y = x[rank::size], y[rank::size]  # explicit API: each rank its share (transparent: all)
os.makedirs(args.out, exist_ok=True)

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(0.01)
if args.api == "explicit":
    optimizer = hvd.DistributedOptimizer(optimizer)
model.compile(optimizer, "mse", jit_compile=False)


class Progress(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        if args.dump_start and rank == 0:
            self.model.save_weights(os.path.join(args.out, "start.weights.h5"))

    def on_epoch_end(self, epoch, logs=None):
        if args.progress:
            with open(f"{args.progress}.{mpi_rank}", "w") as f:
                f.write(f"{os.getpid()} {epoch + 1}\n")
        time.sleep(args.sleep)


callbacks = []
initial_epoch = 0
if args.protect == "backup":
    backup = hvd.callbacks.BackupAndRestore if args.api == "explicit" else \
        keras.callbacks.BackupAndRestore
    callbacks.append(backup(args.dir, delete_checkpoint=not args.keep_backup))
elif args.protect == "modelcheckpoint":
    saved = sorted(glob.glob(os.path.join(args.dir, "ckpt-*.weights.h5")))
    if saved:
        model.optimizer.build(model.trainable_variables)  # so that its state loads too
        model.load_weights(saved[-1])
        initial_epoch = int(re.search(r"ckpt-(\d+)", saved[-1]).group(1))
        print(f"loaded {os.path.basename(saved[-1])}", file=sys.stderr)
    if rank == 0:
        os.makedirs(args.dir, exist_ok=True)
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(args.dir, "ckpt-{epoch:03d}.weights.h5"), save_weights_only=True))
if args.api == "explicit":
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(), *callbacks]
callbacks += [Progress()]
if rank == 0:
    callbacks.append(keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv")))

model.fit(x, y, batch_size=16, epochs=args.epochs, initial_epoch=initial_epoch, shuffle=False,
          callbacks=callbacks, verbose=0)
if rank == 0:
    model.save_weights(os.path.join(args.out, "final.weights.h5"))
state = b"".join(np.asarray(v.numpy()).tobytes() for v in model.variables + optimizer.variables)
print(f"weights-digest {hashlib.sha256(state).hexdigest()}", file=sys.stderr, flush=True)
print(f"learning-rate {float(np.asarray(optimizer.learning_rate)):.9g}", file=sys.stderr,
      flush=True)
