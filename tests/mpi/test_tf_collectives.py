"""Tensor collectives through the Horovod-compatible face: values, tf.function, gradients."""

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import HpcrepError


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def both_modes(fn):
    """Return [eager result, tf.function result]."""
    return [fn(), tf.function(fn)()]


def test_allreduce_values_both_modes(world):
    r, n = world
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]]) * (r + 1)
    tri = n * (n + 1) / 2
    for result in both_modes(lambda: hvd.allreduce(x, op=hvd.Sum)):
        np.testing.assert_array_equal(result, [[tri, 2 * tri], [3 * tri, 4 * tri]])
    for result in both_modes(lambda: hvd.allreduce(x)):
        np.testing.assert_allclose(result, np.array([[1, 2], [3, 4]]) * tri / n, rtol=1e-6)
    for result in both_modes(lambda: hvd.allreduce(x, op=hvd.Max)):
        np.testing.assert_array_equal(result, np.array([[1, 2], [3, 4]]) * n)
    np.testing.assert_array_equal(hvd.allreduce(x, average=False), hvd.allreduce(x, op=hvd.Sum))


def test_static_shape_kept_in_function(world):
    @tf.function
    def f(x):
        y = hvd.allreduce(x)
        assert y.shape == x.shape
        g = hvd.allgather(x)
        assert g.shape.as_list() == [None, 3]
        return y

    f(tf.ones([2, 3]))


def test_grouped_allreduce_and_fp16(world):
    r, n = world
    xs = [tf.fill([3], float(r)), tf.fill([2, 2], 1.0), tf.constant(r, tf.int32)]
    out = hvd.grouped_allreduce(xs, op=hvd.Sum)
    np.testing.assert_array_equal(out[0], np.full(3, n * (n - 1) / 2))
    np.testing.assert_array_equal(out[1], np.full((2, 2), n))
    assert out[2].dtype == tf.int32 and int(out[2]) == n * (n - 1) // 2
    half = hvd.allreduce(tf.fill([4], 0.5), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert half.dtype == tf.float32
    np.testing.assert_array_equal(half, np.full(4, 0.5 * n))


def test_allgather_broadcast_alltoall_reducescatter(world):
    r, n = world
    for g in both_modes(lambda: hvd.allgather(tf.fill([r + 1, 2], r))):
        np.testing.assert_array_equal(g, np.repeat(np.arange(n), np.arange(1, n + 1))[:, None]
                                      * np.ones((1, 2)))
    for b in both_modes(lambda: hvd.broadcast(tf.fill([3], r), root_rank=n - 1)):
        np.testing.assert_array_equal(b, np.full(3, n - 1))
    out = hvd.alltoall(tf.range(n) + 10 * r)
    np.testing.assert_array_equal(out, [r + 10 * k for k in range(n)])
    out, received = hvd.alltoall(tf.range(n) + 10 * r, splits=[1] * n)
    np.testing.assert_array_equal(out, [r + 10 * k for k in range(n)])
    np.testing.assert_array_equal(received, np.ones(n))
    rs = hvd.reducescatter(tf.ones([n, 2]) * (r + 1), op=hvd.Sum)
    np.testing.assert_array_equal(rs, np.full((1, 2), n * (n + 1) / 2))


def _grad(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


def test_allreduce_gradient(world):
    r, n = world
    x = tf.constant([1.0, 2.0, 3.0])
    # loss_r = sum(w_r * allreduce_sum(x)); d/dx = allreduce_sum(w) = n(n+1)/2
    g = _grad(lambda v: tf.reduce_sum((r + 1.0) * hvd.allreduce(v, op=hvd.Sum)), x)
    np.testing.assert_array_equal(g, np.full(3, n * (n + 1) / 2))
    g = _grad(lambda v: tf.reduce_sum((r + 1.0) * hvd.allreduce(v)), x)
    np.testing.assert_allclose(g, np.full(3, (n + 1) / 2), rtol=1e-6)
    g = tf.function(lambda v: _grad(lambda u: tf.reduce_sum(hvd.allreduce(u, op=hvd.Sum)), v))(x)
    np.testing.assert_array_equal(g, np.full(3, n))


def test_allreduce_max_gradient_goes_to_argmax(world):
    r, n = world
    x = tf.constant([float(r), float(-r)])
    g = _grad(lambda v: tf.reduce_sum(hvd.allreduce(v, op=hvd.Max)), x)
    # element 0's max is on rank n-1, element 1's on rank 0; each receives the n summed grads
    np.testing.assert_array_equal(g, [n if r == n - 1 else 0, n if r == 0 else 0])


def test_allgather_gradient(world):
    r, n = world
    x = tf.fill([r + 1, 2], 1.0)
    # Horovod: grad of x_r = mean_k c_k on its rows, for loss_r = sum(c_r * gathered)
    g = _grad(lambda v: tf.reduce_sum((r + 1.0) * hvd.allgather(v)), x)
    np.testing.assert_allclose(g, np.full((r + 1, 2), (n + 1) / 2), rtol=1e-6)


def test_broadcast_gradient(world):
    r, n = world
    x = tf.constant([1.0, 2.0])
    # Horovod: the root gets the upstream gradient averaged across ranks, the others zero
    g = _grad(lambda v: tf.reduce_sum((r + 1.0) * hvd.broadcast(v, root_rank=0)), x)
    np.testing.assert_allclose(g, np.full(2, (n + 1) / 2 if r == 0 else 0), rtol=1e-6)


def test_reducescatter_and_alltoall_gradients(world):
    r, n = world
    x = tf.ones([n, 2])
    # Horovod: allgather of the upstream gradient, times size for Sum
    g = _grad(lambda v: tf.reduce_sum(hvd.reducescatter(v, op=hvd.Sum)), x)
    np.testing.assert_array_equal(g, np.full((n, 2), n))
    g = _grad(lambda v: tf.reduce_sum(hvd.reducescatter(v, op=hvd.Average)), x)
    np.testing.assert_array_equal(g, np.ones((n, 2)))
    g = _grad(lambda v: tf.reduce_sum((r + 1.0) * hvd.alltoall(v)), x)
    # row j went to rank j, which weighs it by j+1
    np.testing.assert_array_equal(g, np.arange(1, n + 1)[:, None] * np.ones((1, 2)))


def test_broadcast_variables_and_objects(world):
    r, n = world
    v = tf.Variable(tf.fill([3], float(r)))
    w = tf.Variable(r, dtype=tf.int64)
    hvd.broadcast_variables([v, w], root_rank=0)
    np.testing.assert_array_equal(v, np.zeros(3))
    assert int(w) == 0
    assert hvd.broadcast_object({"r": r}, root_rank=n - 1) == {"r": n - 1}
    assert hvd.allgather_object(r) == list(range(n))


def test_xla_compiled_collective_is_a_clear_error(world):
    @tf.function(jit_compile=True)
    def f(x):
        return hvd.allreduce(x)

    with pytest.raises(HpcrepError, match="jit_compile=False"):
        f(tf.ones(2))


@pytest.mark.parametrize("threshold", ["0", "256", "64MiB"])
def test_fused_path_odd_sizes_and_inputs_untouched(world, monkeypatch, threshold):
    """Many float tensors (aligned and odd element counts) through the TF-side fusion."""
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", threshold)
    r, n = world
    shapes = [[16], [3, 5], [1], [64, 4], [7], [2, 2, 2]]
    variables = [tf.Variable(tf.fill(s, float(r + i)), dtype=tf.float32)
                 for i, s in enumerate(shapes)]
    half = tf.Variable(tf.fill([33], tf.constant(float(r), tf.float64)))

    @tf.function
    def reduce_all():
        return hvd.grouped_allreduce([v.read_value() for v in variables] + [half.read_value()],
                                     op=hvd.Sum)

    out = reduce_all()
    for i, (s, o) in enumerate(zip(shapes, out)):
        assert o.shape.as_list() == s
        np.testing.assert_array_equal(o, np.full(s, sum(k + i for k in range(n))))
        np.testing.assert_array_equal(variables[i], np.full(s, r + i))  # not reduced in place
    np.testing.assert_array_equal(out[-1], np.full(33, n * (n - 1) / 2))
    np.testing.assert_array_equal(half, np.full(33, r))
    single = tf.Variable(tf.fill([16], 1.0))  # one aligned tensor: the host must copy it
    np.testing.assert_array_equal(tf.function(lambda: hvd.allreduce(single.read_value(),
                                                                    op=hvd.Sum))(), np.full(16, n))
    np.testing.assert_array_equal(single, np.ones(16))
