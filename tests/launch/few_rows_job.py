"""A plain Keras script whose inputs have fewer rows (or ``tf.data`` batches, generator items,
``PyDataset`` batches) than there are ranks, run under ``python -m hpcrep``.

    few_rows_job.py OUT

Every case runs on every rank, in order, so a case that left the ranks out of step in their
collectives would hang or fail a later one. For each case the job records what transparent mode
gave (predictions, an evaluate result, or the type and message of the error raised) beside what
Keras gives in one process on the whole input (computed here with Keras's own loop, unsharded).
Writes ``OUT/rank<rank>.npz`` (arrays ``<case>.got`` and ``<case>.want``) and
``OUT/rank<rank>.json`` (``{case: {"error": [type, message]}}`` for cases that raised).
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hpcrep.comm as hc
from hpcrep.tensorflow.transparent.state import keras_loop

out = sys.argv[1]
size = hc.size()
rng = np.random.default_rng(7)  # the same rows on every rank (a script's data)


def rows(n):
    return rng.normal(size=(n, 3)).astype(np.float32)


def model(built=True):
    layers = [keras.Input((3,))] if built else []
    m = keras.Sequential([*layers, keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(2)])
    m.compile(keras.optimizers.SGD(0.1), "mse")
    return m


def one_process(call):
    """What Keras gives in one process: its own loops, the input not sharded."""
    with keras_loop():
        return call()


arrays, errors = {}, {}


def record(case, got, want):
    arrays[f"{case}.got"], arrays[f"{case}.want"] = np.asarray(got), np.asarray(want)


def record_error(case, call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test compares them across ranks
        errors[case] = [type(exc).__name__, str(exc)]
    else:
        errors[case] = None


m = model()

# predict: the repro, then every kind of input with fewer elements than ranks
one = rows(1)
record("predict_one_row", m.predict(one, verbose=0), one_process(lambda: m.predict(one, verbose=0)))
few = rows(max(size - 1, 1))  # 3 rows at 4 ranks
record("predict_fewer_rows", m.predict(few, batch_size=2, verbose=0),
       one_process(lambda: m.predict(few, verbose=0)))
x5 = rows(2 * max(size - 1, 1) - 1)  # size - 1 batches of 2, the last one partial


def batches():
    return tf.data.Dataset.from_tensor_slices(x5).batch(2)


record("predict_tfdata_fewer_batches", m.predict(batches(), verbose=0),
       one_process(lambda: m.predict(batches(), verbose=0)))
unknown = tf.data.Dataset.from_tensor_slices(x5).filter(lambda r: True).batch(2)  # length unknown
record("predict_tfdata_unknown_length", m.predict(unknown, verbose=0),
       one_process(lambda: m.predict(unknown, verbose=0)))
record("predict_generator_fewer_items",
       m.predict(((b,) for b in np.split(few, len(few))), verbose=0),
       one_process(lambda: m.predict(few, verbose=0)))


class Batches(keras.utils.PyDataset):
    def __init__(self, data):
        super().__init__()
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i:i + 1]


record("predict_pydataset_fewer_batches", m.predict(Batches(few), verbose=0),
       one_process(lambda: m.predict(few, verbose=0)))
# a model not built yet is built inside predict: every rank must build it (a collective)
unbuilt = model(built=False)
got = unbuilt.predict(one, verbose=0)
record("predict_one_row_unbuilt_model", got, unbuilt(one).numpy())
# no rows at all: Keras's own error, on every rank
record_error("predict_no_rows", lambda: m.predict(rows(0), verbose=0))
record_error("predict_no_rows_one_process",
             lambda: one_process(lambda: m.predict(rows(0), verbose=0)))

# evaluate: the whole (small) input on every rank, so the one-process result
y_few = rows(len(few))[:, :2]
record("evaluate_fewer_rows", m.evaluate(few, y_few, verbose=0),
       one_process(lambda: m.evaluate(few, y_few, verbose=0)))
pairs = tf.data.Dataset.from_tensor_slices((x5, x5[:, :2])).batch(2)
record("evaluate_tfdata_fewer_batches", m.evaluate(pairs, verbose=0),
       one_process(lambda: m.evaluate(pairs, verbose=0)))

# fit: an error on every rank, naming the rows (or batches) and the ranks
before = [w.copy() for w in m.get_weights()]
record_error("fit_fewer_rows", lambda: m.fit(few, y_few, verbose=0))
record_error("fit_tfdata_fewer_batches", lambda: m.fit(pairs, verbose=0))
record_error("fit_generator_fewer_items",
             lambda: m.fit(((few[i:i + 1], y_few[i:i + 1]) for i in range(len(few))), verbose=0))
record("fit_refused_weights_unchanged", np.concatenate([w.ravel() for w in m.get_weights()]),
       np.concatenate([w.ravel() for w in before]))
# ... but fit with enough training rows and a small validation set works
x_train = rows(8 * size)
history = m.fit(x_train, x_train[:, :2], validation_data=(few, y_few), epochs=1, verbose=0)
record("fit_small_validation", history.history["val_loss"],
       one_process(lambda: [m.evaluate(few, y_few, verbose=0)]))
# and everything still agrees afterwards: one more predict
record("predict_after_all", m.predict(one, verbose=0),
       one_process(lambda: m.predict(one, verbose=0)))

np.savez(os.path.join(out, f"rank{hc.rank()}.npz"), **arrays)
with open(os.path.join(out, f"rank{hc.rank()}.json"), "w") as f:
    json.dump(errors, f)
print(f"few_rows_job: {len(arrays) // 2} results, {len(errors)} error cases")
