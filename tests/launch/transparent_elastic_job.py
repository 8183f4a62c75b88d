"""An ordinary single-process Keras script (Fashion-MNIST, a small dense model) for the
transparent case of tests/launch/test_ulfm_elastic.py, run as ``python -m hpcrep --elastic
transparent_elastic_job.py OUT [ROWS [EPOCHS [SEED]]]``. Two lines are test instruments, not what a
user writes: with ``KILL_RANK``/``KILL_AT`` in the environment, that MPI rank SIGKILLs itself
before batch ``KILL_AT`` of the second epoch (of epoch ``KILL_EPOCH`` if set; once: not in a
relaunched job), and every process writes its weights to ``OUT/weights<MPI rank>.npz`` (numpy's
writes are not kept to rank 0) so that the test can compare the survivors'. Every process prints
when each ``fit`` attempt begins and each step ends on stderr (``train begin T``, ``step end T``),
for the test's timing.
"""

import os
import signal
import sys
import time

import keras
import numpy as np

from hpcrep.data.mnist import fashion_mnist_split

out = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
x, y = fashion_mnist_split("train", rows)
x_test, y_test = fashion_mnist_split("test", 2000)
x = (x.reshape(len(x), -1) / 255.0).astype("float32")
x_test = (x_test.reshape(len(x_test), -1) / 255.0).astype("float32")
keras.utils.set_random_seed(seed)
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
epoch_now = [0]


def maybe_die(batch, logs=None):
    if (epoch_now[0] == int(os.environ.get("KILL_EPOCH", "1"))
            and batch == int(os.environ.get("KILL_AT", "-1"))
            and world_rank == int(os.environ.get("KILL_RANK", "-1"))
            and not os.path.exists(os.path.join(out, "death"))):  # once (a relaunch runs again)
        with open(os.path.join(out, "death"), "w") as f:
            f.write(f"{time.time():.6f}\n")
        os.kill(os.getpid(), signal.SIGKILL)


instruments = [keras.callbacks.LambdaCallback(
    on_train_begin=lambda logs=None: print(f"train begin {time.time():.6f}", file=sys.stderr,
                                           flush=True),
    on_epoch_begin=lambda epoch, logs=None: epoch_now.__setitem__(0, epoch),
    on_train_batch_begin=maybe_die,
    on_train_batch_end=lambda batch, logs=None: print(f"step end {time.time():.6f}",
                                                      file=sys.stderr, flush=True))]
history = model.fit(x, y, batch_size=32, epochs=epochs, callbacks=instruments, verbose=0)
loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f"epochs logged {len(history.history['loss'])}; test accuracy {accuracy:.4f}")
np.savez(os.path.join(out, f"weights{world_rank}.npz"), *model.get_weights())
