"""Grappler's "layout failed" line, quiet on ranks where the layout optimizer can do nothing.

Every graph that holds hpcrep's compiled allreduce (``HpcrepAllreduceWait`` feeding the reshapes
that cut a fused buffer into tensors) makes Grappler's layout optimizer fail its static shape
pass, and TensorFlow logs it at ERROR level, once per traced function and rank::

    E0000 ... meta_optimizer.cc:967] layout failed: FAILED_PRECONDITION: Input 0 for
    'StatefulPartitionedCall/Reshape' was not previously added to SymbolicShapeRefiner.

The failure is harmless (the meta optimizer keeps the graph as it was and runs its other
passes), and on a process without GPUs the layout optimizer changes nothing even when it
succeeds: with TensorFlow's default ``cpu_layout_conversion`` it returns its input graph as it
is (``GenericLayoutOptimizer::Optimize``, "No layout conversion will take place for CPU"). So
where TensorFlow sees no GPU, ``HPCREP_TF_LOG=quiet`` (the default) turns it off, which removes
the line and a shape pass per function and nothing else. With a GPU it stays on (it converts
convolutions to the GPU's preferred layout there), and so does the line; ``HPCREP_TF_LOG=all``
leaves it on everywhere. A choice the user made (``tf.config.optimizer
.set_experimental_options({"layout_optimizer": ...})``) is kept.
"""

from __future__ import annotations

import tensorflow as tf

from hpcrep import config


def quiet_layout_optimizer() -> bool:
    """Turn Grappler's layout optimizer off if ``HPCREP_TF_LOG`` is ``quiet``, TensorFlow lists
    no GPU and the user has not chosen for it. Call it after the rank's GPUs are pinned.

    Returns True when it turned the optimizer off. Local: each rank decides for itself.
    """
    if config.get("HPCREP_TF_LOG") != "quiet":
        return False
    if "layout_optimizer" in tf.config.optimizer.get_experimental_options():
        return False
    if tf.config.list_physical_devices("GPU"):
        return False
    tf.config.optimizer.set_experimental_options({"layout_optimizer": False})
    return True
