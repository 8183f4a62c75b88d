"""An unchanged single-process Keras script (no hpcrep, no Horovod): ``fit`` a small Dense model on
a fixed regression set. ``hpcrep run`` must run it in transparent mode. Prints the first and last
epoch loss (stdout, rank 0 in transparent mode) and a digest of the final weights and the host
on stderr (every rank: transparent mode leaves stderr alone), so a test can see that every rank
ends equal."""

import hashlib
import socket
import sys

import keras
import numpy as np

data = np.random.default_rng(0)
x = data.normal(size=(256, 8)).astype("float32")
y = (x @ data.normal(size=(8, 1)) + 0.1).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
print(f"train loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}")
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
sys.stderr.write(f"weights-digest {digest.hexdigest()} on {socket.gethostname()}\n")
