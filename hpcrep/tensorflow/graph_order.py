"""One order for hpcrep's host collectives in a TF1 graph: the order they were built in.

In a TF1 graph run by a ``Session``, the executor runs ops with no path between them in any
order, and several at once on its inter-op threads, so two ranks running the same graph may
reach its independent collectives in different orders. The Python path's collectives are
``tf.numpy_function`` calls that block their thread inside MPI; reached in different orders they
would pair the wrong tensors (a mismatch error at best), and matching them by name at run time
would need a free thread per waiting collective (with one inter-op thread, a call waiting for a
name the other rank issues later would deadlock).

So :func:`chained` gives each host collective built in a TF1 graph a control dependency on the
previous one built in the same graph. A program that builds the same graph on every rank then
runs its host collectives in one order everywhere, the order of construction: matching "by name"
in substance, since a graph built by the same program gives the same tensor the same place in
that order. Consequence: fetching a collective also runs the host collectives built before it in
that graph (their results are discarded). Not chained, because something else orders them
already: eager code (program order), ``tf.function`` graphs (automatic control dependencies
order stateful ops), and ops built inside TF1 control flow (``tf.compat.v1.cond``/
``while_loop``), where a control input from outside the frame is not allowed. The compiled
allreduce matches by name in its engine instead (docs/design-notes.md).
"""

from __future__ import annotations

import weakref
from typing import Callable, TypeVar

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

T = TypeVar("T")

# The last host collective built in each TF1 graph (weak: a dropped graph is forgotten).
_last: "weakref.WeakKeyDictionary[tf.Graph, tf.Operation]" = weakref.WeakKeyDictionary()


def _tf1_graph() -> "tf.Graph | None":
    """Return the TF1 graph being built (not eager, not a function, no control flow), or None."""
    if tf.executing_eagerly():
        return None
    graph = tf_ops.get_default_graph()
    if getattr(graph, "building_function", False):
        return None
    if graph._get_control_flow_context() is not None:  # TF1 control flow
        return None
    return graph


def chained(build: Callable[[], T], op_of: Callable[[T], tf.Operation]) -> T:
    """Build a host collective with ``build()`` after the previous one of this TF1 graph.

    Outside a TF1 graph (see the module docstring) ``build()`` runs unchanged. ``op_of`` picks
    the op that later collectives depend on. Local (builds ops, communicates nothing).
    """
    graph = _tf1_graph()
    if graph is None:
        return build()
    previous = _last.get(graph)
    with graph.control_dependencies([previous] if previous is not None else []):
        built = build()
    _last[graph] = op_of(built)
    return built
