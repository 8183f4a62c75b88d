"""hpcrep.tensorflow.graph_order: host collectives of a TF1 graph are chained in build order;
eager code, tf.function graphs and TF1 control flow are left alone."""

from __future__ import annotations

import tensorflow as tf

from hpcrep.tensorflow import graph_order


def _host_op(x):
    return graph_order.chained(
        lambda: tf.numpy_function(lambda a: a, [x], x.dtype, stateful=True), lambda t: t.op)


def test_tf1_graph_ops_depend_on_the_previous_one_built():
    with tf.Graph().as_default():
        first = _host_op(tf.constant(1.0))
        second = _host_op(tf.constant(2.0))
        third = _host_op(tf.constant(3.0))
        assert first.op.control_inputs == []
        assert second.op.control_inputs == [first.op]
        assert third.op.control_inputs == [second.op]
        with tf.Graph().as_default():  # another graph starts its own chain
            assert _host_op(tf.constant(4.0)).op.control_inputs == []


def test_tf_function_and_control_flow_are_not_chained():
    seen = []

    @tf.function
    def f(x):
        a = _host_op(x)
        b = _host_op(x)
        seen.append((a.op.control_inputs, b.op.control_inputs))
        return a + b

    assert float(f(tf.constant(1.0))) == 2.0
    assert seen == [([], [])]
    with tf.Graph().as_default():
        before = _host_op(tf.constant(1.0))
        inside = []

        def branch():
            y = _host_op(tf.constant(2.0))
            inside.append(y)
            return y

        tf.compat.v1.cond(tf.constant(True), branch, lambda: tf.constant(0.0))
        assert before.op not in inside[0].op.control_inputs
        after = _host_op(tf.constant(3.0))
        assert after.op.control_inputs == [before.op]


def test_eager_calls_run_unchanged():
    assert float(_host_op(tf.constant(5.0))) == 5.0
