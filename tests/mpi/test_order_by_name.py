"""Collectives that ranks issue in different orders: TF1 graphs run by a Session, and programs
whose order depends on the rank.

The compiled allreduce matches requests by name when the order differs (native/match.cc); the
Python path runs a TF1 graph's host collectives in the order they were built
(hpcrep/tensorflow/graph_order.py). ``HPCREP_NATIVE`` is read when an op is built, so a graph
built under ``off`` keeps the Python path.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
from hpcrep import config
import hpcrep.tensorflow as hvd
from hpcrep.errors import CollectiveMismatchError
from hpcrep.tensorflow import native

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def setting(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


@pytest.fixture
def compiled(skip_missing):
    """Require the compiled path (a skip for a missing build fails under CI=true)."""
    hvd.init()
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    return hc.rank(), hc.size()


def requests() -> int:
    """Requests the compiled engine of the job's communicator has reduced so far."""
    return native.stats(hc.communicator())[1]


def build_independent_collectives(r: int, n: int):
    """Build, in the default TF1 graph, collectives of every kind with no order between them.

    Returns (fetches, expected values as numpy, number of allreduce requests).
    """
    fetches, expected = [], []
    # Three of one dtype and shape: only their names tell them apart.
    for i, (dtype, shape) in enumerate([(tf.float32, [5]), (tf.float64, [2, 3]),
                                        (tf.float32, [5]), (tf.int32, [7]),
                                        (tf.float32, [4, 1]), (tf.int64, [3]),
                                        (tf.float32, [5]), (tf.float32, [1])]):
        fetches.append(hvd.allreduce(tf.fill(shape, tf.cast(i + r, dtype)), op=hvd.Sum))
        expected.append(np.full(shape, n * i + n * (n - 1) // 2))
    for i in range(3):
        fetches.append(hvd.allgather(tf.fill([r + 1, 2], float(10 * i + r))))
        expected.append(np.concatenate([np.full([q + 1, 2], 10.0 * i + q) for q in range(n)]))
    for i in range(3):
        root = i % n
        fetches.append(hvd.broadcast(tf.fill([3], float(100 * i + r)), root_rank=root))
        expected.append(np.full([3], 100.0 * i + root))
    for i in range(2):
        # Rank r sends value 1000 i + 10 r + j to rank j; it receives 1000 i + 10 q + r from q.
        send = tf.constant([1000.0 * i + 10 * r + j for j in range(n)])
        fetches.append(hvd.alltoall(send))
        expected.append(np.array([1000.0 * i + 10 * q + r for q in range(n)]))
    for i in range(2):
        full = tf.constant([float(1000 * i + k + r) for k in range(2 * n)])
        fetches.append(hvd.reducescatter(full, op=hvd.Sum))
        expected.append(np.array([n * (1000.0 * i + k) + n * (n - 1) / 2
                                  for k in range(2 * r, 2 * r + 2)]))
    return fetches, expected, 8


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_independent_collectives_of_every_kind_in_one_session_run(world, skip_missing, path):
    r, n = world
    hvd.init()
    if path == "compiled" and not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    mode = "on" if path == "compiled" else "off"
    before = requests() if native.active() else 0
    with tf.Graph().as_default():
        with setting("HPCREP_NATIVE", mode):
            fetches, expected, allreduces = build_independent_collectives(r, n)
        with tf.compat.v1.Session() as session:
            for _ in range(3):
                got = session.run(fetches)
                for g, e in zip(got, expected):
                    np.testing.assert_array_equal(g, e)
    if n > 1 and native.active():
        assert requests() - before == (3 * allreduces if path == "compiled" else 0)


def test_allreduces_queued_in_rank_dependent_orders_meet_by_name(compiled):
    r, n = compiled
    if n < 2:
        pytest.skip("needs 2 ranks")
    names = ["a", "b", "c", "d"]
    # Inside tf.function the enqueues run in program order: here, an order per rank.
    order = names if r % 2 == 0 else names[::-1]

    @tf.function
    def step():
        out = {}
        for k in order:
            i = names.index(k)
            # One dtype and shape: only the names tell them apart.
            out[k] = hvd.allreduce(tf.fill([4], float(10 * i + r)), op=hvd.Sum, name=k)
        return out

    before = requests()
    for _ in range(2):
        out = step()
        for i, k in enumerate(names):
            np.testing.assert_array_equal(out[k], np.full([4], 10.0 * i * n + n * (n - 1) / 2))
    assert requests() - before == 2 * len(names)


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_same_name_different_shape_is_a_mismatch_on_every_rank(world, skip_missing, path):
    r, n = world
    hvd.init()
    if n < 2:
        pytest.skip("needs 2 ranks")
    if path == "compiled" and not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    with tf.Graph().as_default():
        with setting("HPCREP_NATIVE", "on" if path == "compiled" else "off"):
            differs = hvd.allreduce(tf.ones([3 + r]), op=hvd.Sum, name="differs")
        with tf.compat.v1.Session() as session:
            # Horovod's FailedPreconditionError on both paths (a host call's error is raised by
            # the compiled library's status op; only without the library does TensorFlow type
            # it by its Python base class, InvalidArgumentError).
            expected = (tf.errors.FailedPreconditionError
                        if native.host_status_op() is not None
                        else tf.errors.InvalidArgumentError)
            with pytest.raises(expected, match="ranks disagree") as info:
                session.run(differs)
            assert "differs" in str(info.value)
    # The job carries on.
    np.testing.assert_array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, n))


@pytest.mark.timeout(180)
def test_names_that_never_meet_fail_on_every_rank_instead_of_hanging(compiled):
    r, n = compiled
    if n < 2:
        pytest.skip("needs 2 ranks")
    # The world engine started with HPCREP_MATCH_TIMEOUT as the job had it (10 s: conftest.py).
    timeout = float(config.get("HPCREP_MATCH_TIMEOUT"))
    start = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match="never met") as info:
        hvd.allreduce(tf.ones(4), op=hvd.Sum, name=f"only_on_rank_{r}")
    assert isinstance(info.value, tf.errors.FailedPreconditionError)
    assert timeout <= time.monotonic() - start < timeout + 30
    assert f"only_on_rank_{(r + 1) % n}" in str(info.value)
    # The engine goes on working.
    np.testing.assert_array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, n))


def test_broadcast_gradient_runs_the_allreduce_on_every_rank_in_a_session(world):
    # The non-root ranks' gradient is zeros; if those zeros did not wait for the gradient's
    # allreduce, a Session would skip it there while the root waits for it (its name then never
    # meets the next allreduce's, or, matched by order, pairs with another collective).
    r, n = world
    hvd.init()
    with tf.Graph().as_default():
        x = tf.fill([5], float(r))
        y = hvd.broadcast(x, root_rank=0)
        grad = tf.gradients(y, x, tf.ones([5]))[0]
        after = hvd.allreduce(tf.fill([5], float(r + 1)), op=hvd.Sum, name="after")
        with tf.compat.v1.Session() as session:
            np.testing.assert_array_equal(session.run(grad), np.full([5], 1.0 if r == 0 else 0.0))
            np.testing.assert_array_equal(session.run(after), np.full([5], n * (n + 1) / 2))
