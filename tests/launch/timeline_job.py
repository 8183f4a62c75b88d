"""A tiny Keras model trained for a few steps with the explicit API, for the timeline tests.

``python timeline_job.py STEPS [--callback] [--tape [--slow-rank R]]``: ``fit`` for STEPS batches
(steps marked by DistributedOptimizer.apply, or by hvd's TimelineCallback with ``--callback``),
or with ``--tape`` a custom loop over ``DistributedGradientTape`` in a ``tf.function``, in which
rank R sleeps 50 ms before each step with ``--slow-rank R`` (a straggler). The timeline is
whatever HPCREP_TIMELINE / HPCREP_TIMELINE_STEPS say (hvd.init starts it, shutdown writes it).
"""

import sys
import time

import keras
import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd
import hpcrep.tensorflow.keras as hvdk

steps = int(sys.argv[1])
hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.random((8 * steps, 8), dtype="float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
if "--tape" in sys.argv:
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    slow = int(sys.argv[sys.argv.index("--slow-rank") + 1]) if "--slow-rank" in sys.argv else -1
    for i in range(steps):
        if hvd.rank() == slow:
            time.sleep(0.05)
        step(x[8 * i:8 * i + 8], y[8 * i:8 * i + 8])
else:
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0)]
    if "--callback" in sys.argv:
        callbacks.append(hvdk.callbacks.TimelineCallback())
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=callbacks)
hvd.shutdown()
print("timeline job done", flush=True)
