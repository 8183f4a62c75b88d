"""The body of run_explicit_job.py and run_horovod_job.py (they differ only in how they import
``hvd``): a 2-layer Dense model trained with ``hvd.DistributedOptimizer(SGD)`` and ``fit`` on this
rank's own shard of a fixed batch, as a Horovod user writes it.

Writes ``OUT/rank<r>.npz``: ``w0`` (the weights after the broadcast from rank 0), ``expected`` (w0
minus lr times the gradient of the mean loss over the WHOLE batch, computed here without
communication), ``w1`` (after one training step), ``final`` (after a few more), ``losses``
and ``host``.
With gradients averaged once over equal shards, ``w1 == expected``; run in transparent mode the
shard is sharded again, and the step follows half the data."""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

ROWS, LR, STEPS = 16, 0.1, 5


def main(hvd) -> None:
    import keras
    import tensorflow as tf

    out = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(100 + rank)  # different starting weights: the broadcast matters
    data = np.random.default_rng(7)
    x = data.normal(size=(ROWS, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    hvd.broadcast_variables(model.variables, root_rank=0)
    w0 = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    expected = [w - LR * g.numpy() for w, g in zip(w0, grads)]

    shard = slice(rank * ROWS // size, (rank + 1) * ROWS // size)
    xs, ys = x[shard], y[shard]
    model.fit(xs, ys, batch_size=len(xs), epochs=1, shuffle=False, verbose=0)
    w1 = [v.numpy() for v in model.trainable_variables]
    history = model.fit(xs, ys, batch_size=len(xs), epochs=STEPS, shuffle=False, verbose=0)
    final = [v.numpy() for v in model.trainable_variables]
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), size=size, host=socket.gethostname(),
             losses=np.array([float(loss)] + history.history["loss"]),
             **{f"{name}{i}": a for name, arrays in
                (("w0_", w0), ("expected_", expected), ("w1_", w1), ("final_", final))
                for i, a in enumerate(arrays)})
