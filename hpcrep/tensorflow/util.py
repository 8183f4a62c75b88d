"""Horovod's ``horovod.tensorflow.util`` names that scripts and Horovod's own tests import.

``from horovod.tensorflow.util import _executing_eagerly`` becomes
``from hpcrep.tensorflow.util import _executing_eagerly``; ``hvd.util._executing_eagerly()`` and
``hvd._executing_eagerly()`` work too. Only this name: the rest of Horovod's module is its
internals.
"""

from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Return True when TensorFlow runs eagerly (False inside a TF1 graph or a tracing
    ``tf.function``), as Horovod's does. Local."""
    return tf.executing_eagerly()
