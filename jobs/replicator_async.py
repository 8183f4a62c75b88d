"""Asynchronous Replicator: sync groups train one linear model, exchanging via a parameter store.

The ranks are split into ``--groups`` sync groups; each group all-reduces its gradients in
lockstep and exchanges parameter deltas with the store on rank 0 every ``--exchange-every`` steps,
without waiting for the other groups. ``--slow-group G --slow-sleep S`` makes group G sleep S
seconds before each step; ``--hold-at K`` also makes it stop before its step K until every other
group has finished (which would deadlock if any group waited for another). ``--groups nodes``
makes one group per node (groups are contiguous blocks of ranks, so ranks placed node by node,
as ``--map-by ppr:2:node`` does, give each node its group). Prints one JSON line on rank 0:
losses, which parameter store ran, every group's step counts as seen at its exchanges and their
divergence, and per rank its host, weights before and after ``join()`` and the sum of the deltas
it pushed, with the store's initial and final values (the final equals the initial plus the sum
of every pushed delta).

    hpcrep run -n 4 jobs/replicator_async.py --slow-group 1 --slow-sleep 0.05 --hold-at 10
    python -m hpcrep.launch.mpirun -n 4 -- python jobs/replicator_async.py
    tests/cluster/mpirun.sh -n 4 --map-by ppr:2:node -- \
        python jobs/replicator_async.py --groups nodes --slow-group 0 --hold-at 10
"""

import argparse
import json
import socket
import time

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.replicator import Replicator, SyncGroups, get_replica_context

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=60, help="steps each group takes")
parser.add_argument("--groups", default="2", help="number of sync groups, or 'nodes': one per node")
parser.add_argument("--exchange-every", type=int, default=1)
parser.add_argument("--delta-scale", type=float, default=None, help="default: 1/groups")
parser.add_argument("--batch-size", type=int, default=16, help="per replica")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--slow-group", type=int, default=-1, help="group that sleeps (-1: none)")
parser.add_argument("--slow-sleep", type=float, default=0.05, help="seconds before each step")
parser.add_argument("--hold-at", type=int, default=-1,
                    help="the slow group waits before this step until the others finished")
parser.add_argument("--hold-timeout", type=float, default=300.0)
args = parser.parse_args()

FEATURES = 8
hvd.init()
host = socket.gethostname()
if args.groups == "nodes":
    num_groups = len(set(hvd.allgather_object(host)))
else:
    num_groups = min(int(args.groups), hvd.size())
rep = Replicator(SyncGroups(num_groups=num_groups,
                            exchange_every=args.exchange_every, delta_scale=args.delta_scale))
# hvd.rank()/hvd.size() describe the job even inside a sync group; the job-wide replica id is
# the Replicator's.
rank = rep.local_replica_ids[0]

rng = np.random.default_rng(0)
x = rng.normal(size=(4096, FEATURES)).astype("float32")
true_w = rng.normal(size=(FEATURES, 1)).astype("float32")
y = (x @ true_w + 0.5 + 0.01 * rng.normal(size=(4096, 1))).astype("float32")

keras.utils.set_random_seed(100 + rank)  # different on purpose: scope() makes them equal
with rep.scope():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
optimizer = rep.wrap_optimizer(keras.optimizers.SGD(args.lr))
optimizer.build(model.trainable_variables)


def input_fn(ctx):
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return ctx.shard(data).shuffle(1024, seed=ctx.replica_id).batch(args.batch_size).repeat()


def step_fn(batch):
    xb, yb = batch
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return get_replica_context().all_reduce("mean", loss)


train_step = tf.function(lambda: rep.run(step_fn, input_fn).values[0])


def full_loss():
    return float(np.mean(np.square(model(x, training=False).numpy() - y)))


initial = full_loss()
slow = rep.group_id == args.slow_group
held_until = None
start = time.perf_counter()
for step in range(args.steps):
    if slow:
        time.sleep(args.slow_sleep)
        if step == args.hold_at:
            deadline = time.time() + args.hold_timeout
            others = [g for g in range(rep.num_groups) if g != rep.group_id]
            while any(rep.peek_group_steps()[g] < args.steps for g in others):
                if time.time() > deadline:
                    raise SystemExit(f"group {rep.group_id} waited {args.hold_timeout}s for the "
                                     "other groups to finish: they did not progress")
                time.sleep(0.01)
            held_until = rep.peek_group_steps().tolist()
    train_step()
elapsed = time.perf_counter() - start
stats = rep.group_stats()
weights_before_join = [w.tolist() for w in model.get_weights()]
steps = rep.join()  # every group pushes its last delta; all ranks adopt the store's parameters
final = full_loss()
weights = [w.tolist() for w in model.get_weights()]
ledger = {k: v.tolist() for k, v in rep.store_ledger().items()}
rep.close()
everyone = hvd.allgather_object({"rank": rank, "host": host, "group": stats["group_id"],
                                 "max_divergence": stats["max_divergence"],
                                 "steps_seen_at_last_exchange": stats["group_steps"],
                                 "exchanges": stats["exchanges"], "elapsed_s": round(elapsed, 3),
                                 "held_until": held_until, "weights": weights,
                                 "weights_before_join": weights_before_join,
                                 "pushed_delta_sum": ledger["pushed"]})
if hvd.rank() == 0:
    print(json.dumps({"initial_loss": initial, "final_loss": final,
                      "param_store": stats["param_store"],
                      "store_initial": ledger["initial"], "store_final": ledger["store"],
                      "final_group_steps": steps.tolist(),
                      "weights_equal": all(e["weights"] == everyone[0]["weights"]
                                           for e in everyone),
                      "weights": everyone[0]["weights"],
                      "ranks": [{k: v for k, v in e.items() if k != "weights"}
                                for e in everyone]}))
