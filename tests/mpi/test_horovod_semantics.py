"""Where hpcrep used to differ from Horovod silently, it now matches Horovod's own tests.

Each test names the Horovod test (``test/parallel/test_tensorflow.py``) whose expected values it
reproduces, with the ranks' data built the same way.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import CollectiveMismatchError, HpcrepError
from hpcrep.tensorflow import native

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


@pytest.fixture
def multi(world):
    if world[1] < 2:
        pytest.skip("needs at least 2 ranks (this run has 1)")
    return world


def _grad(fn, x, grad_ys=None):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x, grad_ys)


# 1. Gradients -----------------------------------------------------------------------------------

def test_allgather_gradient_is_the_averaged_gradient(world):
    """Horovod test_horovod_allgather_grad_cpu: grad_ys holds r on rank r's block on every rank;
    each rank's gradient is its own block, r (the average of equal gradients), not size * r."""
    r, n = world
    sizes = ([3, 2, 7, 4] * 2)[:n]
    results = []  # asserted after every rank has run every collective, so a failure cannot hang
    for dtype, dim in itertools.product([tf.float32, tf.float64], [1, 2]):
        x = tf.cast(tf.ones([sizes[r]] + [3] * (dim - 1)) * r, dtype)
        grad_ys = tf.concat([tf.cast(tf.ones([s] + [3] * (dim - 1)) * k, dtype)
                             for k, s in enumerate(sizes)], axis=0)
        results.append((_grad(hvd.allgather, x, grad_ys), np.full(x.shape, r)))
        # Rank-dependent upstream gradients are averaged, not summed.
        results.append((_grad(lambda v, dtype=dtype: hvd.allgather(v) * tf.cast(r + 1, dtype), x),
                        np.full(x.shape, (n + 1) / 2)))
    for got, want in results:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_broadcast_gradient_is_the_averaged_gradient_on_the_root(world):
    """Horovod test_horovod_broadcast_grad_cpu: grad_ys of ones give 1 on the root, 0 elsewhere."""
    r, n = world
    results = []
    for root in range(n):
        x = tf.ones([5, 2]) * r
        results.append((_grad(lambda v, root=root: hvd.broadcast(v, root_rank=root), x,
                              tf.ones([5, 2])),
                        np.full([5, 2], 1.0 if r == root else 0.0)))
        results.append((_grad(lambda v, root=root: (r + 1.0) * hvd.broadcast(v, root_rank=root),
                              x),
                        np.full([5, 2], (n + 1) / 2 if r == root else 0.0)))
    for got, want in results:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_reducescatter_gradient_matches_horovod(world):
    """Horovod test_horovod_reducescatter_grad_cpu: op=Sum, grad_ys of ones give size everywhere;
    op=Average gives the allgathered gradient unscaled."""
    r, n = world
    for dim in (1, 2):
        x = tf.random.uniform([n * 4] * dim, -100, 100, seed=r)
        g = _grad(lambda v: hvd.reducescatter(v, op=hvd.Sum), x, tf.ones([4] + [n * 4] * (dim - 1)))
        np.testing.assert_array_equal(g, np.full([n * 4] * dim, n))
        g = _grad(lambda v: hvd.reducescatter(v, op=hvd.Average), x,
                  tf.ones([4] + [n * 4] * (dim - 1)))
        np.testing.assert_array_equal(g, np.ones([n * 4] * dim))


def test_allreduce_gradient_keeps_op_and_scale_factors(world):
    """Horovod _allreduce_grad: the gradient is the same allreduce, with the same op and factors."""
    r, n = world
    x = tf.constant([1.0, 2.0, 3.0])
    g = _grad(lambda v: (r + 1.0) * hvd.allreduce(v, op=hvd.Sum, prescale_factor=0.5,
                                                  postscale_factor=3.0), x)
    np.testing.assert_allclose(g, np.full(3, 1.5 * n * (n + 1) / 2), rtol=1e-6)


# 2. float16 scale factors -----------------------------------------------------------------------

def _fp16_case():
    np.random.seed(1234)
    factor = np.random.uniform()
    x = tf.cast(tf.random.stateless_uniform([17, 17], [1, 2], -100, 100), tf.float16)
    expected = tf.cast(tf.constant(factor, tf.float32) * tf.cast(x, tf.float32), tf.float16)
    return factor, x, expected


def test_float16_prescale_is_computed_in_float32(world):
    """Horovod test_horovod_allreduce_cpu_prescale: float16 is scaled in float32 math, then
    rounded once. Only rank 0 contributes, so the sum itself is exact and any difference is the
    scaling's."""
    r, n = world
    factor, x, expected = _fp16_case()
    mine = x if r == 0 else tf.zeros_like(x)
    for fn in (lambda: hvd.allreduce(mine, op=hvd.Sum, prescale_factor=factor),
               tf.function(lambda: hvd.allreduce(mine, op=hvd.Sum, prescale_factor=factor))):
        out = fn()
        assert out.dtype == tf.float16
        np.testing.assert_array_equal(out, expected)
    grouped = hvd.grouped_allreduce([mine, tf.cast(mine, tf.float32)], op=hvd.Sum,
                                    prescale_factor=factor)
    np.testing.assert_array_equal(grouped[0], expected)
    np.testing.assert_allclose(grouped[1], factor * tf.cast(x, tf.float32), rtol=1e-6)


def test_float16_postscale_is_computed_in_float32(world):
    """Horovod test_horovod_allreduce_cpu_postscale (and Average: postscale / size in float32)."""
    r, n = world
    factor, x, expected = _fp16_case()
    mine = x if r == 0 else tf.zeros_like(x)
    np.testing.assert_array_equal(hvd.allreduce(mine, op=hvd.Sum, postscale_factor=factor),
                                  expected)
    same = hvd.allreduce(x, op=hvd.Average, postscale_factor=factor)
    summed = hvd.allreduce(x, op=hvd.Sum)
    np.testing.assert_array_equal(same, tf.cast(tf.cast(summed, tf.float32)
                                                * np.float32(factor / n), tf.float16))
    rs = hvd.reducescatter(tf.concat([mine] * n, axis=0), op=hvd.Sum, postscale_factor=factor)
    np.testing.assert_array_equal(rs, expected)


# 3. alltoall without splits ---------------------------------------------------------------------

def test_alltoall_without_splits_returns_the_tensor_alone(world):
    """Horovod mpi_ops.alltoall: ``(output, rsplits) if splits is not None else output``."""
    r, n = world
    out = hvd.alltoall(tf.range(2 * n) + 100 * r)
    assert isinstance(out, tf.Tensor)
    np.testing.assert_array_equal(out, np.concatenate([[2 * r + 100 * k, 2 * r + 1 + 100 * k]
                                                       for k in range(n)]))
    traced = tf.function(lambda t: hvd.alltoall(t))(tf.ones([n, 3]))
    assert isinstance(traced, tf.Tensor) and traced.shape.as_list() == [n, 3]
    out, received = hvd.alltoall(tf.ones([n * (r + 1), 2]), splits=[r + 1] * n)
    np.testing.assert_array_equal(received, np.arange(1, n + 1))
    assert received.dtype == tf.int32 and out.shape[0] == n * (n + 1) // 2


# 4. grouped_allreduce of IndexedSlices ----------------------------------------------------------

def _slices(r):
    return tf.IndexedSlices(tf.fill([2, 3], float(r + 1)), tf.constant([r % 4, 3]),
                            dense_shape=tf.constant([4, 3]))


def _dense_sum(n):
    total = np.zeros([4, 3])
    for k in range(n):
        total[k % 4] += k + 1
        total[3] += k + 1
    return total


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_allreduce_of_indexed_slices_and_dense(world, op):
    """Horovod grouped_allreduce: IndexedSlices are allgathered (values / size for Average),
    dense tensors reduced; results in the input order."""
    r, n = world
    op = getattr(hvd, op)
    scale = 1.0 if op == hvd.Sum else 1.0 / n
    for fn in (hvd.grouped_allreduce, tf.function(hvd.grouped_allreduce)):
        out = fn([tf.fill([2], float(r)), _slices(r), tf.fill([3], 1.0), _slices(r + 1)], op=op)
        assert isinstance(out[1], tf.IndexedSlices) and isinstance(out[3], tf.IndexedSlices)
        np.testing.assert_allclose(out[0], np.full(2, n * (n - 1) / 2 * scale), rtol=1e-6)
        np.testing.assert_allclose(out[2], np.full(3, n * scale), rtol=1e-6)
        np.testing.assert_allclose(tf.convert_to_tensor(out[1]), _dense_sum(n) * scale,
                                   rtol=1e-6)
        shifted = _dense_sum(n + 1) - np.where(np.arange(4)[:, None] == 0, 1.0, 0.0) \
            - np.where(np.arange(4)[:, None] == 3, 1.0, 0.0)
        np.testing.assert_allclose(tf.convert_to_tensor(out[3]), shifted * scale, rtol=1e-6)


def test_indexed_slices_unsupported_combinations_raise_not_implemented(world):
    """Horovod allreduce: NotImplementedError for other ops and for scale factors with slices."""
    r, _ = world
    with pytest.raises(NotImplementedError, match="op=Sum or Average"):
        hvd.allreduce(_slices(r), op=hvd.Max)
    with pytest.raises(NotImplementedError, match="prescale_factor"):
        hvd.grouped_allreduce([_slices(r)], op=hvd.Sum, prescale_factor=2.0)
    # Both checks happen before anything is sent: the ranks are still in step.
    np.testing.assert_array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, world[1]))


# 5. Error types ---------------------------------------------------------------------------------

def test_mismatch_is_a_failed_precondition_error_on_every_rank(multi):
    """Horovod test_horovod_allreduce_error / _type_error / test_horovod_allgather_error:
    tf.errors.FailedPreconditionError; hpcrep's error also stays a CollectiveMismatchError."""
    r, _ = multi
    cases = [lambda: hvd.allreduce(tf.ones([17 + r, 3])),
             lambda: hvd.allreduce(tf.ones([3], tf.int32 if r % 2 == 0 else tf.float32)),
             lambda: hvd.allgather(tf.ones([2, 10 * (r + 1)])),
             lambda: hvd.broadcast(tf.ones([3 + r]), root_rank=0),
             lambda: hvd.reducescatter(tf.ones([17 + r] * 2))]
    for case in cases:
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            case()
        assert isinstance(info.value, CollectiveMismatchError)
        assert isinstance(info.value, ValueError) and "ranks disagree" in str(info.value)


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "broadcast"])
def test_mismatch_inside_tf_function_is_horovods_error_on_every_rank(multi, collective):
    """Horovod raises tf.errors.FailedPreconditionError for a mismatch; inside tf.function, where
    TensorFlow would re-type a host call's exception by its Python base class
    (InvalidArgumentError), the compiled library's status op raises it with its own code. Without
    the library the mismatch still arrives as an OpError with hpcrep's message."""
    r, _ = multi
    fn = {"allreduce": lambda: hvd.allreduce(tf.ones([3 + r])),
          "allgather": lambda: hvd.allgather(tf.ones([2, 3 + r])),
          "broadcast": lambda: hvd.broadcast(tf.ones([3 + r]), 0)}[collective]
    expected = (tf.errors.FailedPreconditionError if native.host_status_op() is not None
                else tf.errors.OpError)
    with pytest.raises(expected, match="ranks disagree"):
        tf.function(fn)()


def test_bad_alltoall_splits_are_an_invalid_argument_error(world):
    """Horovod test_horovod_alltoall_splits_error: tf.errors.InvalidArgumentError."""
    _, n = world
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        hvd.alltoall(tf.ones([n + 1, 2]), splits=[1] * (n + 1))
    assert isinstance(info.value, HpcrepError) and isinstance(info.value, ValueError)
    if n > 1:  # rows not divisible by the number of ranks (any count divides by 1)
        with pytest.raises(tf.errors.InvalidArgumentError):
            hvd.alltoall(tf.ones([2 * n + 1]))


# 6. BroadcastGlobalVariablesCallback on a lazily built model ------------------------------------

def test_broadcast_callback_on_lazily_built_sequential(world):
    """Horovod broadcasts in on_batch_end of the first batch (keras/callbacks.py); a Sequential
    without Input has no weights before that. fit must run, and end with equal weights."""
    r, n = world
    keras.utils.set_random_seed(100 + r)  # different initial weights on every rank
    model = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    rng = np.random.default_rng(r)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")
    import hpcrep.tensorflow.keras as hvdk
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = hvd.allgather_object([w.tolist() for w in model.get_weights()]
                                   + [np.asarray(v).tolist()
                                      for v in model.optimizer.variables])
    for other in weights[1:]:
        assert other == weights[0]


# 7. Scalars in reducescatter --------------------------------------------------------------------

def test_reducescatter_of_a_scalar_is_a_clear_error_on_every_rank(world):
    """Horovod test_horovod_grouped_reducescatter_scalar_error: InvalidArgumentError, ValueError
    or FailedPreconditionError, not a crash (hpcrep raised IndexError while tracing)."""
    r, n = world
    expected = (tf.errors.InvalidArgumentError, ValueError, tf.errors.FailedPreconditionError)
    with pytest.raises(expected, match="scalar"):
        hvd.reducescatter(tf.constant(float(r)))
    with pytest.raises(expected):
        hvd.grouped_reducescatter([tf.zeros((2, 1)), tf.constant(float(r))])
    with pytest.raises(tf.errors.OpError, match="scalar"):
        tf.function(lambda: hvd.reducescatter(tf.constant(1.0)))()
    np.testing.assert_array_equal(hvd.reducescatter(tf.ones([n]), op=hvd.Sum), [n])


def test_replicator_all_gather_keeps_tf_distribute_summed_gradient(world):
    """The Horovod face averages; hpcrep.replicator follows tf.distribute's all_gather, whose
    gradient sums the upstream gradient (distribute_lib.py, ReplicaContext.all_gather)."""
    from hpcrep.replicator import Replicator, get_replica_context

    r, n = world
    rep = Replicator()
    try:
        def step_fn():
            x = tf.ones([2, 1])
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = get_replica_context().all_gather(x) * float(r + 1)
            return tape.gradient(y, x)

        grad = rep.run(step_fn).values[0]
    finally:
        rep.close()
    np.testing.assert_allclose(grad, np.full([2, 1], n * (n + 1) / 2))


def test_bad_alltoall_splits_on_one_rank_is_an_error_on_every_rank(multi):
    """A bad argument seen by one rank only must not leave the others waiting in MPI."""
    r, n = multi
    splits = [1] * (n + 1) if r == 0 else [1] * n
    with pytest.raises(tf.errors.FailedPreconditionError, match="bad arguments"):
        hvd.alltoall(tf.ones([n + 1 if r == 0 else n, 2]), splits=splits)
    np.testing.assert_array_equal(hvd.alltoall(tf.ones([n])), np.ones(n))  # still in step
