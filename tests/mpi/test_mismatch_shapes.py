"""Shapes that differ while the element count does not ([2, 3] on rank 0, [3, 2] elsewhere) are
a mismatch on every path: the numpy layer, TensorFlow's Python path (``HPCREP_NATIVE=off``) and
the compiled path (shapes known when traced, and shapes known only when the step runs), for
single and grouped allreduces. The error is raised on every rank (the harness fails the test if
any rank did not raise), and the ranks stay in step afterwards.

A check that compared only (dtype, element count) would let these calls through silently, each
rank reading the other's buffer in its own layout; every other mismatch test differs in element
count, so these are the ones that catch it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.errors import CollectiveMismatchError
from hpcrep.tensorflow import native

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def multi(world):
    if world[1] < 2:
        pytest.skip("a mismatch needs at least 2 ranks (this run has 1)")
    hvd.init()
    return world


def shape_of(r: int) -> tuple[int, int]:
    """Rank 0's shape and everyone else's: the same 6 elements, transposed."""
    return (2, 3) if r == 0 else (3, 2)


def assert_still_in_step(n: int) -> None:
    """After the error every rank can still run an agreed collective."""
    np.testing.assert_array_equal(hc.allreduce(np.ones(3), hc.Sum), np.full(3, n))


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_numpy_layer(multi, grouped):
    r, n = multi
    x = np.ones(shape_of(r), np.float32)
    with pytest.raises(CollectiveMismatchError) as info:
        if grouped:
            hc.grouped_allreduce([np.ones(4, np.float32), x], hc.Sum, name="g")
        else:
            hc.allreduce(x, hc.Sum, name="w")
    msg = str(info.value)
    assert "rank 0 passed float32[2, 3]" in msg, msg
    assert "passed float32[3, 2]" in msg, msg
    assert ("position 1 of 2" if grouped else "'w'") in msg, msg
    assert_still_in_step(n)


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_tensorflow_python_path(multi, monkeypatch, grouped, compiled):
    r, n = multi
    monkeypatch.setenv("HPCREP_NATIVE", "off")
    x = tf.ones(shape_of(r))

    def call():
        if grouped:
            return hvd.grouped_allreduce([tf.ones([4]), x], op=hvd.Sum, name="g")
        return hvd.allreduce(x, op=hvd.Sum, name="w")

    expected = tf.errors.OpError if compiled else tf.errors.FailedPreconditionError
    with pytest.raises(expected, match="ranks disagree") as info:
        (tf.function(call) if compiled else call)()
    assert "float32[2, 3]" in str(info.value) and "float32[3, 2]" in str(info.value)
    if not compiled:
        assert isinstance(info.value, CollectiveMismatchError)
    assert_still_in_step(n)


@pytest.fixture
def compiled_path(multi, skip_missing):
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    return multi


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
@pytest.mark.parametrize("how", ["eager", "static", "dynamic"])
def test_compiled_path(compiled_path, grouped, how):
    """``static``: a tf.function traced with the shapes; ``dynamic``: traced with
    ``[None, None]``, so only the op's run-time check sees the shapes."""
    r, n = compiled_path
    x = tf.ones(shape_of(r))

    def call(t):
        if grouped:
            return hvd.grouped_allreduce([tf.ones([4]), t], op=hvd.Sum, name="g")
        return hvd.allreduce(t, op=hvd.Sum, name="w")

    fn = {"eager": call, "static": tf.function(call),
          "dynamic": tf.function(call, input_signature=[tf.TensorSpec([None, None])])}[how]
    with pytest.raises(tf.errors.OpError, match="ranks disagree"):
        fn(x)
    agreed = tf.nest.flatten(fn(tf.ones([2, 3])))[-1]
    np.testing.assert_array_equal(agreed, np.full((2, 3), n))
    assert_still_in_step(n)
