"""op=Adasum: Horovod's adaptive summation, on numpy and on TensorFlow tensors.

Every rank builds every rank's data from one seed, so each can compute the one-rank reference:
Horovod's binary tree (ranks 2i and 2i+1 first, then pairs of pairs; ``reference_tree_reduction``
of ``test/parallel/test_adasum_tensorflow.py``) of the pairwise formula. The tree is checked
bit for bit against :func:`hpcrep.comm.adasum.combine` applied on one rank, and ``combine``
against the closed form written out with numpy's dot products.
"""

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.comm import adasum

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


@pytest.fixture
def power_of_two(world):
    if not adasum.is_power_of_two(world[1]):
        pytest.skip(f"Adasum needs a power-of-two number of ranks (this run has {world[1]})")
    return world


def closed_form(a, b):
    """Horovod's adasum_reference_operation, written out (float64 dot products)."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, anormsq, bnormsq = np.dot(a64, b64), np.dot(a64, a64), np.dot(b64, b64)
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq != 0 else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq != 0 else 1.0
    return (acoeff * a64 + bcoeff * b64).reshape(a.shape)


def tree(values, pair=adasum.combine):
    """One rank's reference: pair (2i, 2i+1) at each level until one value is left."""
    values = list(values)
    while len(values) > 1:
        values = [pair(values[2 * i], values[2 * i + 1]) for i in range(len(values) // 2)]
    return values[0]


def every_rank(n, shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(n)]


def assert_same_on_every_rank(arrays):
    gathered = hc.allgather_object([np.asarray(a).tobytes() for a in arrays])
    assert all(g == gathered[0] for g in gathered), "Adasum results differ across ranks"


def test_combine_is_the_closed_form():
    """The pairwise formula: orthogonal vectors add, parallel ones average, and a random pair
    matches Horovod's reference operation (float64 arithmetic, rounded once)."""
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    np.testing.assert_array_equal(adasum.combine(a, b), a + b)
    np.testing.assert_array_equal(adasum.combine(a * 3, a * 3), a * 3)
    np.testing.assert_array_equal(adasum.combine(np.zeros(3), b), b)  # a zero norm: coefficient 1
    rng = np.random.default_rng(7)
    for dtype, rtol in ((np.float64, 1e-13), (np.float32, 1e-6), (np.float16, 1e-3)):
        x, y = (rng.standard_normal((5, 3)).astype(dtype) for _ in range(2))
        got = adasum.combine(x, y)
        assert got.dtype == dtype and got.shape == (5, 3)
        np.testing.assert_allclose(got.astype(np.float64), closed_form(x, y), rtol=rtol,
                                   atol=rtol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_comm_adasum_is_the_one_rank_tree_bit_for_bit(power_of_two, dtype):
    """hpcrep.comm: per tensor (not per fused buffer), equal to the one-rank tree and the same
    bits on every rank; a tensor of zeros and an empty one pass through."""
    r, n = power_of_two
    shapes = [(4, 3), (7,), (1,), (0,)]
    data = every_rank(n, shapes, dtype, seed=11)
    mine = data[r] + [np.zeros(5, dtype)]
    out = hc.grouped_allreduce(mine, op=hc.Adasum)
    for i, got in enumerate(out[:len(shapes)]):
        want = tree([data[k][i] for k in range(n)])
        assert got.dtype == dtype and got.shape == shapes[i]
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(out[-1], np.zeros(5, dtype))
    assert_same_on_every_rank(out)
    # Against the closed form too: a wrong pairing or coefficient cannot hide behind combine.
    want = tree([data[k][0] for k in range(n)], closed_form)
    np.testing.assert_allclose(out[0].astype(np.float64), want,
                               rtol={np.float16: 1e-2}.get(dtype, 1e-5), atol=1e-2)


def test_comm_adasum_scale_factors(power_of_two):
    """Prescale and postscale apply as in Horovod (before and after the combination)."""
    r, n = power_of_two
    data = every_rank(n, [(6,)], np.float64, seed=3)
    got = hc.allreduce(data[r][0], op=hc.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    np.testing.assert_allclose(got, tree([d[0] * 0.5 for d in data]) * 3.0, rtol=1e-14)


def test_adasum_refuses_what_horovod_refuses(world):
    """Non-power-of-two rank counts and non-float dtypes raise NotImplementedError on every rank
    before anything is sent (the job carries on); so does a tf.IndexedSlices or a process set."""
    r, n = world
    with pytest.raises(NotImplementedError, match="float16, float32 and float64"):
        hc.allreduce(np.ones(3, np.int32), op=hc.Adasum)
    with pytest.raises(NotImplementedError, match="float16, float32 and float64"):
        hvd.allreduce(tf.ones([3], tf.int32), op=hvd.Adasum)
    if not adasum.is_power_of_two(n):
        with pytest.raises(NotImplementedError, match="non-power of 2"):
            hc.allreduce(np.ones(3), op=hc.Adasum)
        with pytest.raises(NotImplementedError, match="non-power of 2"):
            hvd.allreduce(tf.ones([3]), op=hvd.Adasum)
    slices = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([r]))
    with pytest.raises(NotImplementedError, match="sparse"):
        hvd.allreduce(slices, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="sparse"):
        hvd.grouped_allreduce([slices, tf.ones([2])], op=hvd.Adasum)
    if n > 1:  # a process set of one rank is a duplicate of the job at one rank
        subset = hvd.add_process_set([0])
        try:
            with pytest.raises(NotImplementedError, match="process sets"):
                hvd.allreduce(tf.ones([3]), op=hvd.Adasum, process_set=subset)
            with pytest.raises(NotImplementedError, match="process sets"):
                hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum, process_set=subset)
        finally:
            hvd.remove_process_set(subset)
    np.testing.assert_array_equal(hvd.allreduce(tf.ones([2]), op=hvd.Sum), [n, n])  # still fine


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_tf_allreduce_adasum_matches_horovods_test(power_of_two, compiled):
    """Horovod test_horovod_adasum_multiple_allreduce_cpu: 2x2 tensors, float16/32/64, equal to
    the reference within assertAllCloseAccordingToType's tolerances; float32/64 bit for bit with
    the one-rank tree of the same arithmetic, and the same bits on every rank."""
    r, n = power_of_two
    data = every_rank(n, [(2, 2), (2, 2)], np.float64, seed=5)
    for dtype, tol in ((tf.float16, 1e-3), (tf.float32, 1e-6), (tf.float64, 1e-6)):
        tensors = [tf.cast(tf.constant(t), dtype) for t in data[r]]
        reduce = (tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Adasum)) if compiled
                  else lambda ts: [hvd.allreduce(t, op=hvd.Adasum) for t in ts])
        got = [t.numpy() for t in reduce(tensors)]
        np_dtype = dtype.as_numpy_dtype
        for i, g in enumerate(got):
            want = tree([data[k][i] for k in range(n)], closed_form).astype(np_dtype)
            np.testing.assert_allclose(g, want, rtol=tol, atol=tol)
            exact = tree([data[k][i].astype(np_dtype) for k in range(n)])
            if dtype != tf.float16:  # float16 scales in float32 first (a no-op factor here)
                np.testing.assert_array_equal(g, exact)
        assert_same_on_every_rank(got)


def _model_and_data(r):
    rng = np.random.default_rng(100 + r)
    x = rng.standard_normal((8, 3)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    w = tf.Variable(np.array([[0.5], [-1.0], [2.0]], np.float32))
    b = tf.Variable(np.array([0.25], np.float32))
    return x, y, [w, b]


def _local_grads(x, y, variables):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, variables[0]) + variables[1] - y) ** 2)
    return tape, loss


def test_distributed_gradient_tape_adasum(power_of_two):
    """DistributedGradientTape(op=Adasum): each gradient is the Adasum tree of the ranks' local
    gradients (bit for bit) and the same on every rank; unreduced local gradients differ."""
    r, n = power_of_two
    x, y, variables = _model_and_data(r)
    tape, loss = _local_grads(x, y, variables)
    local = [g.numpy() for g in tape.gradient(loss, variables)]
    tape, loss = _local_grads(x, y, variables)
    reduced = [g.numpy() for g in hvd.DistributedGradientTape(tape, op=hvd.Adasum)
               .gradient(loss, variables)]
    everyone = hc.allgather_object(local)
    for i, g in enumerate(reduced):
        np.testing.assert_array_equal(g, tree([everyone[k][i] for k in range(n)]))
    assert_same_on_every_rank(reduced)
    if n > 1:
        assert not np.array_equal(everyone[0][0], everyone[1][0])  # the test means something


def test_distributed_optimizer_adasum_with_backward_passes(power_of_two):
    """DistributedOptimizer(op=Adasum, backward_passes_per_step=2): the first call only
    accumulates; the second applies lr times the Adasum of each rank's summed gradients (no
    averaging of the passes, no learning-rate scaling), and the weights agree on every rank.
    average_aggregated_gradients=True is refused, as in Horovod."""
    import keras

    r, n = power_of_two
    with pytest.raises(ValueError, match="average_aggregated_gradients"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum,
                                 backward_passes_per_step=2, average_aggregated_gradients=True)
    x, y, variables = _model_and_data(r)
    start = [v.numpy() for v in variables]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum,
                                   backward_passes_per_step=2)
    passes = []
    for half in (slice(0, 4), slice(4, 8)):
        tape, loss = _local_grads(x[half], y[half], variables)
        grads = tape.gradient(loss, variables)
        passes.append([g.numpy() for g in grads])
        opt.apply_gradients(zip(grads, variables))
        if half.start == 0:
            for v, s in zip(variables, start):
                np.testing.assert_array_equal(v.numpy(), s)  # nothing applied after one pass
    summed = [passes[0][i] + passes[1][i] for i in range(2)]
    everyone = hc.allgather_object(summed)
    for i, v in enumerate(variables):
        step = tree([everyone[k][i] for k in range(n)])
        np.testing.assert_allclose(v.numpy(), start[i] - np.float32(0.1) * step, rtol=1e-6,
                                   atol=1e-7)
    assert_same_on_every_rank([v.numpy() for v in variables])
