"""Every variable starts with rank 0's value: patch Keras variable initialisation.

Keras 3 funnels every variable it creates (layer weights, optimizer slots, metric state, seed
generators) through the TensorFlow backend's ``Variable._initialize``. The patch lets it run, then
overwrites the new value with rank 0's (one broadcast per variable, when it is created). Ranks run
the same script, so they create the same variables in the same order; if they do not, the
collective's signature check raises :class:`~hpcrep.errors.CollectiveMismatchError` instead of
hanging.

Also agreed at start: TensorFlow's global random seed (rank 0 draws one), so that random ops
without an explicit seed, such as ``Dataset.shuffle`` before sharding, produce the same sequence
on every rank and the shards stay disjoint.

Plain ``tf.Variable`` objects created outside Keras are not intercepted.
"""

from __future__ import annotations

import random
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.eager import context as tf_context

from hpcrep import comm
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class
from hpcrep.tensorflow.variables import broadcast_variables


def _broadcast_new_variable(variable: Any) -> None:
    """Give ``variable`` (a ``tf.Variable``) rank 0's value. Collective."""
    with tf.init_scope():
        if tf.executing_eagerly():
            broadcast_variables([variable], root_rank=0)


def install(patches: PatchSet) -> None:
    """Patch variable creation and agree on the global random seed.

    Collective: every rank must call this.
    """
    owner = defining_class(keras.Variable, "_initialize")
    original = vars(owner)["_initialize"]

    def _initialize(self: Any, value: Any) -> None:
        original(self, value)
        if comm.size() > 1:
            _broadcast_new_variable(self._value)

    patches.attr(owner, "_initialize", _initialize)
    patches.label("variable initialisation (rank 0's values)")

    previous = tf_context.global_seed()
    seed = comm.broadcast_object(random.SystemRandom().randrange(2**31) if previous is None
                                 else previous, 0)
    tf.random.set_seed(seed)

    def restore_seed() -> None:
        if tf_context.global_seed() == seed:
            tf.random.set_seed(previous)

    patches.on_restore(restore_seed)
    patches.label(f"random seed {seed} (rank 0's)")
