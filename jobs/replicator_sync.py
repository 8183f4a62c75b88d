"""Synchronous Replicator: one replica's input_fn and step_fn, replicated on every rank.

A small MLP with cross-replica batch norm classifies synthetic Gaussian clusters. ``input_fn``
shards the data by replica; ``step_fn`` computes one replica's loss and applies the gradients
through ``wrap_optimizer`` (averaged over replicas); accuracy is summed over replicas with the
replica context's ``all_reduce``; ``reduce`` gives the mean loss. Prints one JSON line on rank 0.

    hpcrep run -n 4 jobs/replicator_sync.py
    python -m hpcrep.launch.mpirun -n 4 -- python jobs/replicator_sync.py --steps 100
"""

import argparse
import json

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.replicator import CrossReplicaBatchNormalization, Replicator, get_replica_context

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch-size", type=int, default=32, help="per replica")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--eager", action="store_true", help="do not compile the step")
args = parser.parse_args()

FEATURES, CLASSES = 10, 4
rng = np.random.default_rng(0)
centres = rng.normal(scale=2.0, size=(CLASSES, FEATURES))
labels = rng.integers(0, CLASSES, size=8192)
x = (centres[labels] + rng.normal(size=(labels.size, FEATURES))).astype("float32")
y = labels.astype("int32")

rep = Replicator()  # initialises hpcrep; one replica per rank
keras.utils.set_random_seed(hvd.rank())  # deliberately different: scope() equalises them
with rep.scope():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(32),
                              CrossReplicaBatchNormalization(), keras.layers.ReLU(),
                              keras.layers.Dense(CLASSES)])
optimizer = rep.wrap_optimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
optimizer.build(model.trainable_variables)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def input_fn(ctx):
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return ctx.shard(data).shuffle(2048, seed=ctx.replica_id).batch(args.batch_size).repeat()


def step_fn(batch):
    xb, yb = batch
    with tf.GradientTape() as tape:
        logits = model(xb, training=True)
        loss = loss_fn(yb, logits)
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), yb),
                                    tf.float32))
    ctx = get_replica_context()
    seen = ctx.all_reduce("sum", tf.stack([correct, tf.cast(tf.size(yb), tf.float32)]))
    return loss, seen[0] / seen[1]


def train_step():
    loss, accuracy = rep.run(step_fn, input_fn).values[0]
    return rep.reduce("mean", loss), accuracy


if not args.eager:
    train_step = tf.function(train_step)
losses, accuracies = [], []
for _ in range(args.steps):
    loss, accuracy = train_step()
    losses.append(float(loss))
    accuracies.append(float(accuracy))
weights = hvd.allgather_object([w.tolist() for w in model.get_weights()])
rep.close()
if hvd.rank() == 0:
    print(json.dumps({"ranks": hvd.size(), "first_loss": losses[0], "last_loss": losses[-1],
                      "last_accuracy": accuracies[-1],
                      "weights_equal": all(w == weights[0] for w in weights)}))
