"""An unchanged Keras script with Keras's own TensorBoard callback (for test_tensorboard.py):
under ``python -m hpcrep`` with ``HPCREP_TENSORBOARD=auto`` hpcrep's communication scalars go
beside its runs.    tensorboard_job.py LOG_DIR"""

import sys

import keras
import numpy as np

keras.utils.set_random_seed(1)
x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, batch_size=8, epochs=2, verbose=0,
          callbacks=[keras.callbacks.TensorBoard(sys.argv[1])])
