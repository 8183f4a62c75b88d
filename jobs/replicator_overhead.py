"""Per-step cost of Replicator.run against the explicit DistributedOptimizer loop, same model.

Three variants train the same MLP on the same fixed per-rank batch, each with its step in a
``tf.function`` (or eager with ``--eager``):

- ``explicit``: ``hvd.DistributedOptimizer`` in a hand-written GradientTape step;
- ``run_args``: ``Replicator.run(step_fn, args=(x, y))`` with ``wrap_optimizer``;
- ``run_input_fn_reduce``: ``Replicator.run(step_fn, input_fn)`` plus ``reduce("mean", loss)``
  (input pipeline and one more allreduce per step: the full TF-Replicator idiom).

The variants alternate in rounds (so machine noise hits them alike); a round's time is the
slowest rank's. Prints one JSON line on rank 0: median and minimum ms per step of each variant,
the op count of each compiled step, and the eager Python cost of one run() call.

    python -m hpcrep.launch.mpirun -n 2 -- python jobs/replicator_overhead.py
"""

import argparse
import json
import time

import keras
import numpy as np
import tensorflow as tf
from mpi4py import MPI

import hpcrep.tensorflow as hvd
from hpcrep.replicator import Replicator

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--steps", type=int, default=30, help="steps per variant per round")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--hidden", type=int, default=256)
parser.add_argument("--eager", action="store_true")
args = parser.parse_args()

hvd.init()
rep = Replicator()
FEATURES, CLASSES = 784, 10
rng = np.random.default_rng(hvd.rank())
x = tf.constant(rng.normal(size=(args.batch_size, FEATURES)).astype("float32"))
y = tf.constant(rng.integers(0, CLASSES, size=args.batch_size).astype("int32"))
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
compile_ = (lambda f: f) if args.eager else tf.function


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    return model


def one_step(model, opt, xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss


# explicit Horovod-style path
m1 = make()
o1 = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
o1.build(m1.trainable_variables)
hvd.broadcast_variables(m1.variables, root_rank=0)
explicit = compile_(lambda: one_step(m1, o1, x, y))

# Replicator paths
with rep.scope():
    m2 = make()
    m3 = make()
o2 = rep.wrap_optimizer(keras.optimizers.SGD(0.01))
o2.build(m2.trainable_variables)
o3 = rep.wrap_optimizer(keras.optimizers.SGD(0.01))
o3.build(m3.trainable_variables)
run_args = compile_(lambda: rep.run(lambda a, b: one_step(m2, o2, a, b), args=(x, y)).values[0])


def input_fn(ctx):
    return tf.data.Dataset.from_tensors((x, y)).repeat()


def full_idiom():
    return rep.reduce("mean", rep.run(lambda batch: one_step(m3, o3, *batch), input_fn))


run_input_fn_reduce = compile_(full_idiom)

variants = {"explicit": explicit, "run_args": run_args, "run_input_fn_reduce": run_input_fn_reduce}
for fn in variants.values():  # trace and warm up
    for _ in range(5):
        fn()
world = MPI.COMM_WORLD
times = {k: [] for k in variants}
for _ in range(args.rounds):
    for name, fn in variants.items():
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = fn()
        float(loss)
        elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        times[name].append(elapsed / args.steps * 1e3)


def graph_ops(fn):
    """Number of ops in the compiled step (same count = no extra work per step)."""
    return len(fn.get_concrete_function().graph.get_operations())


ops = {} if args.eager else {k: graph_ops(fn) for k, fn in variants.items()}

# Python-side cost of run() itself (context push/pop, PerReplica), eager, trivial step.
constant = tf.constant(1.0)
trivial = lambda: constant  # noqa: E731
reps = 20000
start = time.perf_counter()
for _ in range(reps):
    trivial()
bare = time.perf_counter() - start
start = time.perf_counter()
for _ in range(reps):
    rep.run(trivial)
wrapped = time.perf_counter() - start
rep.close()
if hvd.rank() == 0:
    median = {k: float(np.median(v)) for k, v in times.items()}
    fastest = {k: float(np.min(v)) for k, v in times.items()}  # least disturbed by other load
    print(json.dumps({"ranks": hvd.size(), "eager": args.eager, "median_ms_per_step": median,
                      "min_ms_per_step": fastest,
                      "graph_ops": ops, "run_dispatch_us": (wrapped - bare) / reps * 1e6,
                      "overhead_ms": {k: median[k] - median["explicit"] for k in median
                                      if k != "explicit"},
                      "rounds_ms": {k: [round(t, 3) for t in v] for k, v in times.items()}}))
