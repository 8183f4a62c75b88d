"""Horovod's API in TF1 graphs run by a session: grouped_reducescatter and
broadcast_global_variables, as Horovod's own tests build them (``tf.Graph`` + ``Session``)."""

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd

pytestmark = pytest.mark.timeout(180)

# Several inter-op threads: the session may run independent ops in any order, differently on
# each rank, as Horovod's test sessions do.
_CONFIG = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def test_grouped_reducescatter_in_a_graph_reduces_each_tensor_with_its_own(world):
    """Horovod test_horovod_grouped_reducescatter_cpu in graph mode: six tensors of one shape
    whose values differ; each rank gets its rows of each tensor's own sum (exact closed form),
    in every one of several sessions, and the gradient is the allgathered upstream gradient
    times size. A group that ran as separate ops paired tensors at random across ranks.
    The gradients (one gather per tensor, as Horovod's) run one per session.run: independent
    collectives of one run have no order yet."""
    r, n = world
    k = 6
    for trial in range(4):
        with tf.Graph().as_default(), tf.compat.v1.Session(config=_CONFIG) as session:
            tensors = [tf.constant(np.full([n * 2, 3], (i + 1) * (r + 1), np.float32))
                       for i in range(k)]
            reduced = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
            grad_ys = [tf.fill([2, 3], float((i + 1) * (r + 1))) for i in range(k)]
            grads = tf.gradients(reduced, tensors, grad_ys)
            got = session.run(reduced)
            got_grads = [session.run(g) for g in grads]
        for i in range(k):
            np.testing.assert_array_equal(got[i], np.full([2, 3], (i + 1) * n * (n + 1) / 2),
                                          err_msg=f"trial {trial}, tensor {i}")
            want = np.concatenate([np.full([2, 3], (i + 1) * (q + 1) * n, np.float32)
                                   for q in range(n)])
            np.testing.assert_array_equal(got_grads[i], want, err_msg=f"gradient {i}")


def test_grouped_reducescatter_in_a_graph_with_scale_factors_and_float16(world):
    """Mixed dtypes and a prescale factor in one group: float16 scaled in float32 (Horovod's CPU
    arithmetic), the others on the host; Average divides by size."""
    r, n = world
    with tf.Graph().as_default(), tf.compat.v1.Session(config=_CONFIG) as session:
        tensors = [tf.constant(np.full([n, 2], r + 1, dtype)) for dtype in
                   (np.float16, np.float32, np.float64, np.float16)]
        summed = hvd.grouped_reducescatter(tensors, op=hvd.Sum, prescale_factor=0.5)
        averaged = hvd.grouped_reducescatter(tensors, op=hvd.Average)
        # Two groups in two runs: independent ops of one run have no order.
        got_sum = session.run(summed)
        got_avg = session.run(averaged)
    for s, a, t in zip(got_sum, got_avg, tensors):
        assert s.dtype == t.dtype.as_numpy_dtype and s.shape == (1, 2)
        np.testing.assert_array_equal(s, np.full([1, 2], 0.5 * n * (n + 1) / 2))
        # Average folds 1/size into the copy (1/3 is inexact; float16 rounds it coarsely).
        tol = 1e-3 if a.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(a, np.full([1, 2], (n + 1) / 2), rtol=tol, atol=0)


def test_broadcast_global_variables_in_a_graph(world):
    """Horovod test_horovod_broadcast_graph_mode: every global variable of the graph (several
    dtypes, resource and TF1 reference variables) takes the root's values, bit for bit."""
    r, n = world
    root = n - 1
    with tf.Graph().as_default(), tf.compat.v1.Session(config=_CONFIG) as session:
        values = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) + 0.1,
                  "f64": np.full([4], np.pi * (r + 1)),
                  "i32": np.array([r, -r, 7 * r], np.int32)}
        variables = [tf.compat.v1.Variable(v, name=k) for k, v in values.items()]
        variables.append(tf.compat.v1.Variable(np.float32(r) + 0.5, use_resource=False,
                                               name="legacy"))
        session.run(tf.compat.v1.global_variables_initializer())
        bcast = hvd.broadcast_global_variables(root)
        session.run(bcast)
        got = session.run(variables)
    for k, g in zip(values, got):
        want = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3) * (root + 1) + 0.1,
                "f64": np.full([4], np.pi * (root + 1)),
                "i32": np.array([root, -root, 7 * root], np.int32)}[k]
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g, want)
    assert got[-1] == np.float32(root) + 0.5


def test_broadcast_global_variables_eagerly_is_a_runtime_error():
    """Horovod test_horovod_broadcast_eager_mode_error: RuntimeError with Horovod's advice."""
    assert hvd.util._executing_eagerly() and hvd._executing_eagerly()
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        hvd.broadcast_global_variables(root_rank=0)
    with tf.Graph().as_default():
        assert not hvd.util._executing_eagerly()
