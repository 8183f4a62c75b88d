"""Replicas of several ranks: a click model whose embedding table and wide layer are sharded.

Each example is ``--ids`` categorical ids from one table of ``--rows`` rows; its click label comes
from a hidden score per id. The model is ``ShardedEmbedding -> ColumnParallelDense(relu) ->
RowParallelDense(1)``: with ``--ranks-per-replica k`` each replica is k consecutive ranks that
split the table's rows and the wide layer's units between them and run ``step_fn`` on the same
batch, while ``wrap_optimizer`` averages gradients over the replicas. Prints one JSON line on
rank 0: losses, step time, and the parameter bytes each rank holds against the same model
unsharded.

    python -m hpcrep.launch.mpirun -n 4 -- python -m jobs.replicator_tensor_parallel \\
        --ranks-per-replica 2

A table too big for one rank's share of the node: before building anything, the ranks agree on
the memory each would hold (its rows of the table, its optimizer slots for them, the wide
layers) and on this node's share per rank (``MemAvailable`` over the ranks on the node, the
smallest over nodes); where it does not fit, every rank stops with the smallest
``--ranks-per-replica`` that does. The table is drawn block by block
(:class:`~hpcrep.replicator.sharded_init.RowBlockInitializer`), so a rank draws only its rows,
and the data's cost is that of the ids that occur, not of the table. Example, 4 ranks on 24 GiB
(a 2.4 GiB table and its momentum slot): ``--rows 1000000 --dim 640`` stops at k=1 and k=2 and
runs at k=4.
"""

import argparse
import json
import resource
import time

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.replicator import (ColumnParallelDense, Replicator, RowParallelDense,
                               ShardedEmbedding)
from hpcrep.replicator.sharded_init import RowBlockInitializer
from hpcrep.tensorflow.sharded_variables import parameter_bytes

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--ranks-per-replica", type=int, default=2)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--rows", type=int, default=100_000, help="embedding table rows")
parser.add_argument("--dim", type=int, default=16, help="embedding width")
parser.add_argument("--ids", type=int, default=4, help="ids per example")
parser.add_argument("--hidden", type=int, default=256, help="units of the wide layer")
parser.add_argument("--batch-size", type=int, default=128, help="per replica")
parser.add_argument("--lr", type=float, default=2.0, help="sparse ids: a large rate")
parser.add_argument("--momentum", type=float, default=0.9,
                    help="SGD momentum (0: no slot, half the optimizer memory)")
parser.add_argument("--eager", action="store_true", help="do not compile the step")
args = parser.parse_args()

GIB = 2**30


def bytes_per_rank(k: int) -> int:
    """The peak memory one rank adds for the model at k ranks per replica, on top of what it
    holds before building it (the same formula on every rank). Measured on this job at 4 ranks,
    k=4 (10M x 16, 40M x 16 and 1M x 640 rows): its rows of the table are held 3 times at the
    peak without momentum (twice while they are drawn, once more for the step's update, which
    densifies the table's gradient) and 5 to 6 times with it (the slot, and the dense momentum
    update); the wide layers' slices are small beside them."""
    rows = -(-args.rows // k)  # the largest shard (hpcrep.replicator.tensor_parallel.even_rows)
    wide = (args.ids * args.dim * args.hidden) // k + args.hidden // k + args.hidden
    copies = 6 if args.momentum else 3
    return (rows * args.dim * copies + wide * 3) * 4


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS). Local."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def share_per_rank() -> int:
    """This node's available memory over its ranks, the smallest over the job's nodes.
    Collective."""
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    return int(hvd.allreduce(tf.constant(available // hvd.local_size(), tf.int64), op=hvd.Min))


hvd.init()
share, k = share_per_rank(), args.ranks_per_replica
# What a rank holds already (TensorFlow, MPI), the largest over ranks: the same on every rank.
base = int(hvd.allreduce(tf.constant(resident_bytes(), tf.int64), op=hvd.Max))


def needed(d: int) -> int:
    return base + bytes_per_rank(d)


if needed(k) > base + share:  # the same figures on every rank: every rank stops here
    fits = [d for d in range(k, hvd.size() + 1)
            if hvd.size() % d == 0 and needed(d) <= base + share]
    hint = (f"use --ranks-per-replica {fits[0]} (about {needed(fits[0]) / GIB:.2f} GiB per "
            "rank)" if fits else "no split of this job's ranks fits: use more ranks or nodes, "
            "or a smaller --rows")
    raise SystemExit(f"replicator_tensor_parallel: the model needs about "
                     f"{needed(k) / GIB:.2f} GiB per rank at --ranks-per-replica {k} "
                     f"({args.rows} rows x {args.dim}), more than the "
                     f"{(base + share) / GIB:.2f} GiB each of this node's ranks can have (what "
                     f"it holds now, {base / GIB:.2f}, and its share of MemAvailable, "
                     f"{share / GIB:.2f}); {hint}")

rng = np.random.default_rng(0)
hot = rng.integers(0, args.rows, size=2048)  # the ids that occur (a table mostly cold, as usual)
hot_score = rng.normal(size=hot.size).astype("float32")  # a hidden score per id that occurs
which = rng.integers(0, hot.size, size=(16384, args.ids))
examples = hot[which].astype("int64" if args.rows > 2**31 - 1 else "int32")
clicks = (hot_score[which].sum(1) > 0).astype("float32")[:, None]

rep = Replicator(ranks_per_replica=args.ranks_per_replica)
keras.utils.set_random_seed(1)  # the same on every rank: each draws whole weights, keeps a slice
with rep.scope():
    model = keras.Sequential([keras.Input((args.ids,), dtype=examples.dtype.name),
                              ShardedEmbedding(args.rows, args.dim, RowBlockInitializer(
                                  block_rows=1 << 16, seed=1)),
                              keras.layers.Flatten(),
                              ColumnParallelDense(args.hidden, activation="relu"),
                              RowParallelDense(1)])
    optimizer = rep.wrap_optimizer(keras.optimizers.SGD(args.lr, momentum=args.momentum))
optimizer.build(model.trainable_variables)
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)


def input_fn(ctx):  # ctx is the replica's: every rank of a replica reads the same batches
    data = tf.data.Dataset.from_tensor_slices((examples, clicks))
    return ctx.shard(data).shuffle(4096, seed=ctx.replica_id).batch(args.batch_size).repeat()


def step_fn(batch):
    ids, labels = batch
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(ids, training=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss


def train_step():
    return rep.reduce("mean", rep.run(step_fn, input_fn))


if not args.eager:
    train_step = tf.function(train_step)
losses, times = [], []
for _ in range(args.steps):
    start = time.perf_counter()
    losses.append(float(train_step()))
    times.append(time.perf_counter() - start)
held = hvd.allgather_object(parameter_bytes(model.weights))
slots = hvd.allgather_object(parameter_bytes(
    [v for v in optimizer.variables if len(v.shape) > 0]))  # the slots, not the step counters
peak_rss = hvd.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
rep.close()
if hvd.rank() == 0:
    print(json.dumps({"ranks": hvd.size(), "ranks_per_replica": args.ranks_per_replica,
                      "replicas": hvd.size() // args.ranks_per_replica,
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "mean_loss_by_tenth": [float(np.mean(part)) for part in
                                             np.array_split(losses, min(10, len(losses)))],
                      "median_step_s": float(np.median(times[len(times) // 2:])),
                      "parameter_bytes_per_rank": [h["held"] for h in held],
                      "parameter_bytes_unsharded": held[0]["unsharded"],
                      "slot_bytes_per_rank": [h["held"] for h in slots],
                      "slot_bytes_unsharded": slots[0]["unsharded"],
                      "estimated_peak_bytes_per_rank": needed(k),
                      "share_per_rank": base + share,
                      "peak_rss_bytes_per_rank": peak_rss}))
