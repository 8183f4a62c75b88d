"""A job for test_tf_log.py: an allreduce inside tf.function, a graph that holds hpcrep's
compiled allreduce when it is active (Grappler's passes must succeed on it). Run under
``hpcrep run`` (transparent mode, which has called hvd.init()); rank 0 prints."""

import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import native


@tf.function
def total(x: tf.Tensor) -> tf.Tensor:
    return hvd.allreduce(x, op=hvd.Sum)


print(f"sum {float(tf.reduce_sum(total(tf.ones([3, 4])))):.0f} of {hvd.size()} ranks", flush=True)
print(f"native {native.active()}", flush=True)
