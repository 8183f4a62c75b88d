"""One function chooses the allreduce path (fused.choose_allreduce_path), and the compiled
path's engines start, stop and carry errors by code on every rank."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.errors import CollectiveMismatchError
from hpcrep.tensorflow import fused, native
from hpcrep.tensorflow.fused import AllreducePath

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def test_the_path_follows_size_dtype_shape_and_setting(world, monkeypatch):
    r, n = world
    world_comm = hc.communicator()
    floats, ints = [tf.ones([3])], [tf.ones([3], tf.int32)]
    unknown = [tf.TensorSpec([None], tf.float32)]  # only its dtype and shape are looked at
    monkeypatch.setenv("HPCREP_NATIVE", "off")
    if n == 1:
        assert fused.choose_allreduce_path(floats, 1.0, 1.0, world_comm) is AllreducePath.IDENTITY
        assert fused.choose_allreduce_path(ints, 2.0, 1.0, world_comm) is AllreducePath.HOST
        return
    assert fused.choose_allreduce_path(floats, 1.0, 1.0, world_comm) is AllreducePath.FUSED_HOST
    assert fused.choose_allreduce_path(ints, 1.0, 1.0, world_comm) is AllreducePath.HOST
    assert fused.choose_allreduce_path(unknown, 1.0, 1.0, world_comm) is AllreducePath.HOST
    monkeypatch.setenv("HPCREP_NATIVE", "auto")
    expected = AllreducePath.COMPILED if native.active() else AllreducePath.FUSED_HOST
    assert fused.choose_allreduce_path(floats, 1.0, 1.0, world_comm) is expected
    if native.active():
        assert fused.choose_allreduce_path(ints, 1.0, 1.0, world_comm) is expected
        complex_ = [tf.ones([3], tf.complex64)]
        assert fused.choose_allreduce_path(complex_, 1.0, 1.0, world_comm) is AllreducePath.HOST


def test_a_process_set_engine_stops_when_its_set_is_removed(world, skip_missing):
    r, n = world
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    if n < 3:
        pytest.skip("needs 3 ranks (a set of 2 or more, smaller than the job)")
    ps = hc.add_process_set(list(range(n - 1)))
    member = r < n - 1
    communicator = hc.resolve(ps) if member else None
    try:
        if member:
            step = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, process_set=ps))
            np.testing.assert_array_equal(step(tf.ones(5)), np.full(5, n - 1))
            started = native._find(communicator)
            assert started is not None and started.communicator is communicator
            assert native.stats(communicator)[1] >= 1
    finally:
        hc.remove_process_set(ps)  # frees the communicator: its engine's thread stops, is joined
    if member:
        assert native._find(communicator) is None
        assert native.stats(communicator) == (0, 0)
    np.testing.assert_array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, n))


def test_a_mismatch_arrives_as_hpcrep_type_on_every_rank(world, skip_missing):
    r, n = world
    if n < 2:
        pytest.skip("needs 2 ranks")
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    with pytest.raises(CollectiveMismatchError, match="rank 1 passed") as info:
        hvd.allreduce(tf.ones([2 + r], tf.float64), op=hvd.Sum, name="by_code")
    assert isinstance(info.value, tf.errors.FailedPreconditionError)
    assert os.environ.get("HPCREP_NATIVE", "auto") != "off"
