"""Horovod's gradient options of DistributedGradientTape and DistributedOptimizer on real ranks:
``gradient_predivide_factor``, ``sparse_as_dense``, ``num_groups`` and ``groups``.

Horovod's semantics (horovod/tensorflow/__init__.py): with op=Average, gradients are scaled by
``1 / gradient_predivide_factor`` before the sum and by ``gradient_predivide_factor / size``
after it; ``sparse_as_dense`` turns ``tf.IndexedSlices`` into dense tensors before reducing;
``num_groups`` (deprecated there for ``groups=<int>``) splits the gradients into that many fused
allreduces, and ``groups=[[v, ...], ...]`` reduces each inner list together and every variable in
no list on its own. Grouping decides how many exchanges run, never the values.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd

TINY = 2.0 ** -24  # float16's smallest subnormal
SIZE = hc.size()  # (the suite's conftest has initialised hpcrep)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def tape_gradient(w, upstream, **options):
    """The reduced gradient of ``sum(w * upstream)`` (which is ``upstream``) with ``options``."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * upstream)
    return hvd.DistributedGradientTape(tape, **options).gradient(loss, [w])[0]


# gradient_predivide_factor --------------------------------------------------------------------

def test_gradient_predivide_factor_gives_horovods_average(world):
    r, n = world
    w = tf.Variable([1.0, 2.0, 3.0])
    mine = np.array([r + 1, 2 * (r + 1), 0.5 + r], np.float32)
    everyone = np.array([[k + 1, 2 * (k + 1), 0.5 + k] for k in range(n)], np.float32)
    for factor in (1.0, 2.0, 3.0, float(n)):
        got = tape_gradient(w, tf.constant(mine), gradient_predivide_factor=factor)
        want = (everyone / factor).sum(axis=0) * (factor / n)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, err_msg=f"factor {factor}")


def test_gradient_predivide_factor_scales_before_and_after_the_sum_in_float16(world):
    """In float16 where the scaling happens shows. 2 x TINY on every rank, factor 2: divided by
    the factor first, each is TINY (exact), the sum n x TINY (exact), times 2 / n: 2 x TINY.
    Divided by size first instead, at 4 ranks each would be TINY / 2, which rounds to 0. And
    30000 on every rank, factor = size: 30000 / size each, the sum 30000, times 1: 30000;
    summed before any division the total would pass float16's 65504 and become inf."""
    r, n = world
    w = tf.Variable([0.0, 0.0], dtype=tf.float16)
    got = tape_gradient(w, tf.constant([2 * TINY, 2 * TINY], tf.float16),
                        gradient_predivide_factor=2.0)
    np.testing.assert_array_equal(got.numpy(), np.float16([2 * TINY, 2 * TINY]))
    got = tape_gradient(w, tf.constant([30000.0, -30000.0], tf.float16),
                        gradient_predivide_factor=float(n))
    np.testing.assert_array_equal(got.numpy(), np.float16([30000.0, -30000.0]))


def test_distributed_optimizer_applies_the_predivided_average(world):
    r, n = world
    w = keras.Variable(np.zeros(2, np.float16), dtype="float16")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), gradient_predivide_factor=2.0)
    opt.apply([tf.constant([2 * TINY, -2 * TINY], tf.float16)], [w])  # w = 0 - 1.0 x average
    np.testing.assert_array_equal(np.asarray(w), np.float16([-2 * TINY, 2 * TINY]))


# sparse_as_dense ------------------------------------------------------------------------------

def _embedding_gradient(r):
    """An embedding table and the tape of a loss touching rows ``r % 5`` and 4 of it."""
    table = keras.Variable(np.zeros((5, 2), np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, tf.constant([r % 5, 4])) * float(r + 1))
    return table, tape, loss


def _dense_average(n):
    """The average over ranks of every rank's dense embedding gradient."""
    total = np.zeros((5, 2), np.float32)
    for k in range(n):
        total[k % 5] += k + 1
        total[4] += k + 1
    return total / n


def test_sparse_as_dense_reduces_indexed_slices_as_one_dense_average(world):
    r, n = world
    table, tape, loss = _embedding_gradient(r)
    grad = hvd.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, [table])[0]
    assert not isinstance(grad, tf.IndexedSlices), type(grad)
    assert grad.shape == (5, 2)
    np.testing.assert_allclose(grad.numpy(), _dense_average(n), rtol=1e-6)

    table, tape, loss = _embedding_gradient(r)  # without: slices, allgathered, same average
    grad = hvd.DistributedGradientTape(tape).gradient(loss, [table])[0]
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), _dense_average(n), rtol=1e-6)


def test_distributed_optimizer_with_sparse_as_dense_applies_the_dense_average(world):
    r, n = world
    table, tape, loss = _embedding_gradient(r)
    local = tape.gradient(loss, table)
    assert isinstance(local, tf.IndexedSlices)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=True)
    opt.apply([local], [table])
    np.testing.assert_allclose(np.asarray(table), -_dense_average(n), rtol=1e-6)


# num_groups and groups ------------------------------------------------------------------------

def _four_variables():
    return [tf.Variable(tf.zeros(shape), name=f"v{j}")
            for j, shape in enumerate([[3], [2, 2], [5], [1]])]


def _grouped_gradients(variables, r, **options):
    """Reduced gradients of variable j = 10 (j + 1) + rank: a mix-up of slots changes values."""
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v * float(10 * (j + 1) + r))
                         for j, v in enumerate(variables)])
    return [g.numpy() for g in hvd.DistributedGradientTape(tape, **options).gradient(
        loss, variables)]


def _expected(variables, n):
    return [np.full(v.shape, 10 * (j + 1) + (n - 1) / 2, np.float32)
            for j, v in enumerate(variables)]


@pytest.mark.parametrize("options, exchanges", [
    ({}, 1),
    ({"num_groups": 2}, 2),
    ({"num_groups": 3}, 3),
    ({"num_groups": 4}, 4),
])
def test_num_groups_sets_the_number_of_exchanges_not_the_values(world, allreduces, options,
                                                                exchanges):
    r, n = world
    variables = _four_variables()
    got = _grouped_gradients(variables, r, **options)
    for g, want in zip(got, _expected(variables, n)):
        np.testing.assert_array_equal(g, want)
    # One rank has nothing to exchange: its gradients are already the average.
    assert len(allreduces) == (exchanges if n > 1 else 0), allreduces
    if n > 1:
        assert sum(len(names) for names in allreduces) == 4  # each gradient exactly once


def test_groups_reduces_each_listed_group_in_one_exchange(world, allreduces):
    r, n = world
    v = _four_variables()
    got = _grouped_gradients(v, r, groups=[[v[0], v[2]], [v[3]]])
    for g, want in zip(got, _expected(v, n)):
        np.testing.assert_array_equal(g, want)
    if n > 1:
        sizes = [len(names) for names in allreduces]
        assert sizes[:2] == [2, 1], allreduces  # the listed groups, in order
        assert sum(sizes) == 4, allreduces


def test_groups_reduces_each_unlisted_variable_on_its_own_as_horovod(world, allreduces):
    r, n = world
    if n == 1:
        pytest.skip("nothing is exchanged on one rank")
    v = _four_variables()
    _grouped_gradients(v, r, groups=[[v[0], v[2]]])
    assert [len(names) for names in allreduces] == [2, 1, 1], allreduces


def test_distributed_optimizer_num_groups_sets_the_exchanges(world, allreduces):
    r, n = world
    variables = [keras.Variable(np.zeros(shape, np.float32))
                 for shape in ([3], [2, 2], [5], [1])]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), num_groups=2)
    opt.build(variables)
    opt.apply([tf.fill(v.shape, float(10 * (j + 1) + r)) for j, v in enumerate(variables)],
              variables)
    for v, want in zip(variables, _expected(variables, n)):
        np.testing.assert_array_equal(np.asarray(v), -want)
    assert len(allreduces) == (2 if n > 1 else 0), allreduces


def test_groups_as_a_number_is_horovods_num_groups(world, allreduces):
    r, n = world
    variables = _four_variables()
    got = _grouped_gradients(variables, r, groups=2)
    for g, want in zip(got, _expected(variables, n)):
        np.testing.assert_array_equal(g, want)
    assert len(allreduces) == (2 if n > 1 else 0), allreduces
