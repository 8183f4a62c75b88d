"""Every variable starts with rank 0's value: patch Keras variable initialisation, and catch plain
``tf.Variable`` creation.

Keras 3 funnels every variable it creates (layer weights, optimizer slots, metric state, seed
generators) through the TensorFlow backend's ``Variable._initialize``. The patch lets it run, then
overwrites the new value with rank 0's (one broadcast per variable, when it is created). Ranks run
the same script, so they create the same variables in the same order; if they do not, the
collective's signature check raises :class:`~hpcrep.errors.CollectiveMismatchError` instead of
hanging.

Also agreed at start: TensorFlow's global random seed (rank 0 draws one), so that random ops
without an explicit seed, such as ``Dataset.shuffle`` before sharding, produce the same sequence
on every rank and the shards stay disjoint.

Plain ``tf.Variable`` objects (a custom loop's own weights, a ``tf.random.Generator``'s state) are
caught by a variable creator scope entered on the thread that enters transparent mode: each one
created eagerly gets rank 0's value the same way. Variables a ``tf.function`` creates while it is
being traced are not broadcast (their initial value only exists inside the graph); create them
eagerly, or call :func:`hpcrep.tensorflow.broadcast_variables` on them.
"""

from __future__ import annotations

import random
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.eager import context as tf_context

from hpcrep import comm
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class
from hpcrep.tensorflow.transparent.state import creating_locally, local_only
from hpcrep.tensorflow.variables import broadcast_variables


def _broadcasting() -> bool:
    """True when a variable created now on this thread must get rank 0's value."""
    return comm.size() > 1 and not creating_locally()


def _broadcast_new_variable(variable: Any) -> None:
    """Give ``variable`` (a ``tf.Variable``) rank 0's value. Collective."""
    with tf.init_scope():
        # Keras's symbolic build (compute_output_spec) creates metric and loss trackers whose
        # value does not have the variable's shape yet; they start at zero on every rank anyway,
        # and fit's BroadcastGlobalVariablesCallback covers the model and optimizer again.
        if tf.executing_eagerly() and variable.value().shape == variable.shape:
            broadcast_variables([variable], root_rank=0)


def _broadcast_plain_variables(next_creator: Any, **kwargs: Any) -> Any:
    """Variable creator: create the ``tf.Variable``, then give it rank 0's value when it was
    created eagerly outside Keras (Keras variables are broadcast by the ``_initialize`` patch).
    Collective for eagerly created variables: the ranks create the same ones in the same order."""
    variable = next_creator(**kwargs)
    if _broadcasting() and tf.executing_eagerly():
        broadcast_variables([variable], root_rank=0)
    return variable


def _enter_creator_scope(patches: PatchSet) -> None:
    """Install :func:`_broadcast_plain_variables` on this thread until the patches are restored."""
    scope = tf.variable_creator_scope(_broadcast_plain_variables)
    scope.__enter__()
    patches.on_restore(lambda: scope.__exit__(None, None, None))


def install(patches: PatchSet) -> None:
    """Patch variable creation and agree on the global random seed.

    Collective: every rank must call this.
    """
    owner = defining_class(keras.Variable, "_initialize")
    original = vars(owner)["_initialize"]

    def _initialize(self: Any, value: Any) -> None:
        with local_only():  # the tf.Variable inside is broadcast once, below
            original(self, value)
        if _broadcasting():
            _broadcast_new_variable(self._value)

    patches.attr(owner, "_initialize", _initialize)
    _enter_creator_scope(patches)
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
