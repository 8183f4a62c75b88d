"""Horovod's ``examples/tensorflow2/tensorflow2_keras_mnist.py``, run under hpcrep.

The structure and every Horovod call are the example's; the one Horovod-facing change is the
import (``horovod.tensorflow.keras`` -> ``hpcrep.tensorflow.keras``). Other differences, none of
them about Horovod: the data is Debian's offline Fashion-MNIST instead of a downloaded MNIST, the
model, batch and step counts are small enough for a 2-core machine, the rank-0 checkpoint is left
out, and ``compile`` has no ``experimental_run_tf_function=False`` (Keras 3 rejects that argument,
with Horovod as with hpcrep).
"""

import tensorflow as tf

import hpcrep.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd


def train(images, labels, epochs=4, steps=64, batch=32):
    # Horovod: initialize Horovod.
    hvd.init()

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(2048).batch(batch)

    # Built lazily by its first batch: no Input layer, as in Horovod's example.
    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of workers.
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: warm the learning rate up to lr * size over the first three epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Horovod: adjust number of steps based on number of workers.
    history = mnist_model.fit(dataset, steps_per_epoch=steps // hvd.size(), callbacks=callbacks,
                              epochs=epochs, verbose=verbose)
    return mnist_model, history
