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
"""

import argparse
import json
import time

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.replicator import (ColumnParallelDense, Replicator, RowParallelDense,
                               ShardedEmbedding)
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
parser.add_argument("--eager", action="store_true", help="do not compile the step")
args = parser.parse_args()

rng = np.random.default_rng(0)
hot = rng.integers(0, args.rows, size=2048)  # the ids that occur (a table mostly cold, as usual)
score = rng.normal(size=args.rows).astype("float32")
examples = rng.choice(hot, size=(16384, args.ids)).astype("int32")
clicks = (score[examples].sum(1) > 0).astype("float32")[:, None]

rep = Replicator(ranks_per_replica=args.ranks_per_replica)
keras.utils.set_random_seed(1)  # the same on every rank: each draws whole weights, keeps a slice
with rep.scope():
    model = keras.Sequential([keras.Input((args.ids,), dtype="int32"),
                              ShardedEmbedding(args.rows, args.dim),
                              keras.layers.Flatten(),
                              ColumnParallelDense(args.hidden, activation="relu"),
                              RowParallelDense(1)])
    optimizer = rep.wrap_optimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
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
rep.close()
if hvd.rank() == 0:
    print(json.dumps({"ranks": hvd.size(), "ranks_per_replica": args.ranks_per_replica,
                      "replicas": hvd.size() // args.ranks_per_replica,
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "median_step_s": float(np.median(times[len(times) // 2:])),
                      "parameter_bytes_per_rank": [h["held"] for h in held],
                      "parameter_bytes_unsharded": held[0]["unsharded"]}))
