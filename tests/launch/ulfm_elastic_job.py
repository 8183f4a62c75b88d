"""A Horovod-elastic Keras job on Fashion-MNIST for tests/launch/test_ulfm_elastic.py (and
docs/measurements.md's figures): under ``mpirun --with-ft ulfm`` (Open MPI 5, .venv-ulfm), rank
``--victim`` SIGKILLs itself before global step ``--kill-at`` of epoch 0; the survivors shrink,
return to the last commit and finish in the same ``mpirun``.

Every epoch walks one permutation of the training rows in global batches of ``size x batch``
rows, rank r taking the r-th slice; the state holds how many rows of the epoch are done, so
after a shrink the survivors go on from the last commit with the rows not yet trained on (none
twice, none skipped, in what the model kept). Each survivor writes ``OUT/rank<R>.json`` (its
rank before and after, step end times, recoveries, test accuracy, rows trained per epoch) and
``OUT/weights-rank<R>.npz``; a rank spawned to grow the job back (``HPCREP_ELASTIC_MAX_NP``)
writes ``OUT/grown<R>.json`` and ``OUT/weights-grown<R>.npz`` (R: its rank when it joined); the
victim writes ``OUT/death`` (the time it killed itself). ``--kill-in-grow R``: rank R SIGKILLs
itself as the job begins to grow back (once).
"""

import argparse
import json
import os
import signal
import socket
import time

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow.keras as hvd
import hpcrep.comm
from hpcrep.comm import grow, recovery, world
from hpcrep.data.mnist import fashion_mnist_split

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--rows", type=int, default=4096, help="training rows (Fashion-MNIST)")
parser.add_argument("--test-rows", type=int, default=2000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch", type=int, default=32, help="rows per rank and step")
parser.add_argument("--commit-every", type=int, default=5, help="steps between commits")
parser.add_argument("--victim", type=int, default=-1, help="rank that SIGKILLs itself")
parser.add_argument("--kill-at", type=int, default=20, help="in epoch 0, before this step")
parser.add_argument("--kill-epoch", type=int, default=0,
                    help="the epoch in which the victim SIGKILLs itself (--kill-at, --kill-rows)")
parser.add_argument("--kill-rows", type=int, default=-1,
                    help="the victim SIGKILLs itself once this many rows of --kill-epoch are "
                         "done (-1: --kill-at steps of the first size), right after the commit "
                         "of that row count: a planned stop at any commit (tests/chaos)")
parser.add_argument("--ledger", action="store_true",
                    help="every rank appends each step's rows and each resume to "
                         "OUT/ledger-<name>.jsonl as it goes, so that the rows of a rank killed "
                         "from outside are known (tests/chaos)")
parser.add_argument("--raise", dest="raise_", action="store_true",
                    help="the victim raises an exception (unhandled) instead of SIGKILL")
parser.add_argument("--stop", action="store_true",
                    help="the victim SIGSTOPs itself (a hung rank) instead of SIGKILL")
parser.add_argument("--kill-in-grow", type=int, default=-1,
                    help="this rank SIGKILLs itself as the job begins to grow back (once: "
                         "OUT/killed-in-grow marks it), a failure during MPI_Comm_spawn")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--print-steps", action="store_true", help="rank 0 prints each step's end")
parser.add_argument("--epochs-after-relaunch", type=int, default=0,
                    help="a job relaunched from a commit (hpcrep run --elastic) ends after "
                         "this many more epochs (0: at --epochs), so that a test can give the "
                         "first job many epochs to run shrunk without waiting for all of them")
args = parser.parse_args()

hvd.init()
first_rank, first_size = hvd.rank(), hvd.size()
spawned = world.spawned_to_grow()  # started by the job to grow back (HPCREP_ELASTIC_MAX_NP)
name = f"grown{first_rank}" if spawned else f"rank{first_rank}"
if args.kill_in_grow >= 0 and not spawned:  # a test instrument, not what a job does
    _grow = grow.grow

    def _die_then_grow(plan):
        marker = os.path.join(args.out, "killed-in-grow")
        if hvd.rank() == args.kill_in_grow and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(f"{time.time():.6f}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return _grow(plan)

    grow.grow = _die_then_grow
keras.utils.set_random_seed(args.seed * 100 + hvd.rank())  # differs until the first sync
x_train, y_train = fashion_mnist_split("train", args.rows)
x_test, y_test = fashion_mnist_split("test", args.test_rows)
x_train = (x_train.reshape(len(x_train), -1) / 255.0).astype("float32")
x_test = (x_test.reshape(len(x_test), -1) / 255.0).astype("float32")

model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
state = hvd.elastic.KerasState(model, epoch=0, rows_done=0)
step_ends: list[float] = []
fed: list[list[int]] = []      # per step this rank ran: [epoch, rows_done before it, its rows...]
resumes: list[list] = []  # where and when each call of train() started: [epoch, rows_done, time]


def log_ledger(entry: dict) -> None:
    """With --ledger, append ``entry`` to this process's ledger file at once."""
    if args.ledger:
        with open(os.path.join(args.out, f"ledger-{name}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")


def order(epoch: int) -> np.ndarray:
    """The epoch's permutation of the training rows (the same on every rank)."""
    return np.random.default_rng([args.seed, epoch]).permutation(len(x_train))


class Progress(keras.callbacks.Callback):
    """Counts the rows done, commits every ``--commit-every`` steps, kills the victim."""

    def __init__(self, epoch: int, rows: np.ndarray) -> None:
        super().__init__()
        self.epoch, self.rows, self.steps = epoch, rows, 0

    def on_train_batch_begin(self, batch, logs=None):
        kill_rows = (args.kill_rows if args.kill_rows >= 0
                     else args.kill_at * first_size * args.batch)
        if (self.epoch == args.kill_epoch and first_rank == args.victim and not spawned
                and state.rows_done >= kill_rows):
            with open(os.path.join(args.out, "victim_fed.json"), "w") as f:
                json.dump(fed, f)
            with open(os.path.join(args.out, "death"), "w") as f:
                f.write(f"{time.time():.6f}\n")
            if args.raise_:
                raise RuntimeError(f"injected failure of rank {first_rank}")
            os.kill(os.getpid(), signal.SIGSTOP if args.stop else signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        step_ends.append(time.time())
        if args.print_steps and hvd.rank() == 0:
            print(f"rank 0 step {len(step_ends)} at {step_ends[-1]:.3f}", flush=True)
        n = hvd.size()
        mine = self.rows[self.steps * args.batch:(self.steps + 1) * args.batch]
        fed.append([self.epoch, state.rows_done] + [int(r) for r in mine])
        log_ledger({"t": step_ends[-1], "fed": fed[-1]})
        state.rows_done += n * args.batch
        self.steps += 1
        if self.steps % args.commit_every == 0:
            state.commit()


@tf.function
def average_first_rank():
    """Traced before the failure: afterwards it must average over the survivors only."""
    return hvd.allreduce(tf.constant(float(first_rank)), op=hvd.Average)


if not spawned:  # a spawned rank's first collective must be the state's sync
    average_first_rank()


@hvd.elastic.run
def train(state):
    # Back at the last commit (rank 0's): steps this rank ran after it were not kept.
    resumes.append([state.epoch, state.rows_done, time.time()])
    log_ledger({"t": resumes[-1][2], "resume": resumes[-1][:2]})
    fed[:] = [f for f in fed if (f[0], f[1]) < (state.epoch, state.rows_done)]
    # this process's first sync resumed past the start: a relaunch from a commit on disk
    relaunched = not spawned and (resumes[0][0], resumes[0][1]) > (0, 0)
    last = args.epochs
    if relaunched and args.epochs_after_relaunch:
        last = min(args.epochs, resumes[0][0] + args.epochs_after_relaunch)
    for epoch in range(state.epoch, last):
        n, r, b = hvd.size(), hvd.rank(), args.batch
        perm = order(epoch)
        steps = (len(perm) - state.rows_done) // (n * b)
        mine = np.concatenate([perm[state.rows_done + s * n * b + r * b:
                                    state.rows_done + s * n * b + (r + 1) * b]
                               for s in range(steps)]) if steps else np.zeros(0, np.int64)
        model.fit(x_train[mine], y_train[mine], batch_size=b, epochs=1, shuffle=False,
                  verbose=0, callbacks=[Progress(epoch, mine)])
        state.epoch, state.rows_done = epoch + 1, 0
        state.commit()


train(state)
logits = model.predict(x_test, batch_size=500, verbose=0)
accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
result = {
    "average_first_rank": float(average_first_rank()),
    "first_rank": first_rank, "first_size": first_size, "rank": hvd.rank(), "size": hvd.size(),
    "spawned": spawned, "host": socket.gethostname(),
    "growths": [{"old_size": g.old_size, "new_size": g.new_size, "places": g.plan.places,
                 "spawn_seconds": g.spawn_seconds, "rebuild_seconds": g.rebuild_seconds}
                for g in grow.history()],
    "step_ends": step_ends, "accuracy": accuracy, "library": hpcrep.comm.mpi_library_version(),
    "fed": fed, "resumes": resumes, "rows": len(x_train), "batch": args.batch,
    "recoveries": [{"lost": list(r.lost), "old_size": r.old_size, "new_size": r.new_size,
                    "noticed": r.noticed, "shrink_seconds": r.shrink_seconds,
                    "rebuild_seconds": r.rebuild_seconds} for r in recovery.history()],
}
with open(os.path.join(args.out, f"{name}.json"), "w") as f:
    json.dump(result, f)
np.savez(os.path.join(args.out, f"weights-{name}.npz"), *model.get_weights())
