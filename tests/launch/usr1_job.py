"""A Keras script that every rank sends SIGUSR1 mid-fit, as Slurm's --signal USR1@N does (for
test_preemption_signal.py): without HPCREP_CHECKPOINT_DIR the job must not die of it."""

import os
import signal

import keras
import numpy as np


class Preempt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            os.kill(os.getpid(), signal.SIGUSR1)


keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, x.sum(axis=1), batch_size=8, epochs=3, verbose=0, callbacks=[Preempt()])
print(f"trained {len(history.history['loss'])} epochs", flush=True)
