"""A job for test_tf_log.py: an allreduce inside tf.function, a graph that holds hpcrep's
compiled allreduce when it is active (Grappler's passes must succeed on it). Run under
``hpcrep run``, which runs it as it is (it uses the explicit API); rank 0 prints."""

import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import native

hvd.init()


@tf.function
def total(x: tf.Tensor) -> tf.Tensor:
    return hvd.allreduce(x, op=hvd.Sum)


result = float(tf.reduce_sum(total(tf.ones([3, 4]))))  # every rank: a collective
if hvd.rank() == 0:
    print(f"sum {result:.0f} of {hvd.size()} ranks", flush=True)
    print(f"native {native.active()}", flush=True)
