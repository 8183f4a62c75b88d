"""A job for test_tf_log.py: an allreduce inside tf.function, the graph that makes Grappler's
layout optimizer print "layout failed" when hpcrep's compiled allreduce is active. Run under
``hpcrep run`` (transparent mode, which has called hvd.init()); rank 0 prints."""

import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import native


@tf.function
def total(x: tf.Tensor) -> tf.Tensor:
    return hvd.allreduce(x, op=hvd.Sum)


print(f"sum {float(tf.reduce_sum(total(tf.ones([3, 4])))):.0f} of {hvd.size()} ranks", flush=True)
print(f"native {native.active()}", flush=True)
