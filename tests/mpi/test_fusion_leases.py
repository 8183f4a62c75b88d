"""Results of the numpy collectives are views of pooled fusion buffers: later calls of the same
layout must never be handed those buffers while the results live (the pool lends a buffer to one
holder at a time, and results hold theirs until they are gone). Meaningful at any size: the
expected values are computed from the world size."""

import gc

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import fusion

pytestmark = pytest.mark.timeout(60)


def test_allreduce_results_survive_later_calls_of_the_same_layout(world):
    r, n = world
    first = hc.grouped_allreduce([np.full(5, r + 1.0, np.float32), np.full(3, 2, np.int64)],
                                 op=hc.Sum)
    for k in range(6):  # more calls than the pool keeps buffers per size
        hc.grouped_allreduce([np.full(5, 100.0 + k, np.float32), np.zeros(3, np.int64)],
                             op=hc.Sum)
    assert first[0].tolist() == [n * (n + 1) / 2] * 5
    assert first[1].tolist() == [2 * n] * 3


def test_other_results_survive_later_calls(world):
    r, n = world
    gathered = hc.allgather(np.full((2, 3), r, np.int32))
    broadcast = hc.broadcast(np.full(4, r + 0.5), root_rank=0)
    scattered = hc.reducescatter(np.ones((n * 2, 3), np.float32), op=hc.Sum)
    for _ in range(6):
        hc.allgather(np.full((2, 3), -1, np.int32))
        hc.broadcast(np.full(4, -1.0), root_rank=0)
        hc.reducescatter(np.zeros((n * 2, 3), np.float32), op=hc.Sum)
    assert gathered.tolist() == [[q] * 3 for q in range(n) for _ in range(2)]
    assert broadcast.tolist() == [0.5] * 4
    assert scattered.tolist() == [[float(n)] * 3] * 2


def test_buffers_come_back_once_results_are_gone(world):
    """The bucket under the results is lent to nobody while they live and is lent again (the
    pool's free list is last in, first out) once they are gone. The garbage collector is held
    off so that no other buffer returns in between."""
    f32 = np.dtype(np.float32)
    length = 3 * fusion.padded_count(37, f32.itemsize)  # the one bucket of three 37-float arrays
    gc.disable()
    try:
        results = hc.grouped_allreduce([np.ones(37, np.float32) for _ in range(3)], op=hc.Sum)
        address = results[0].__array_interface__["data"][0]  # slot 0 starts the bucket
        with fusion.POOL.take(f32, length) as other:
            assert not np.shares_memory(other, results[0])
        del results
        with fusion.POOL.take(f32, length) as again:
            assert again.__array_interface__["data"][0] == address
    finally:
        gc.enable()
