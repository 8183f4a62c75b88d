"""Exact values of every numpy collective and reduction op, at any world size."""

import numpy as np
import pytest

import hpcrep.comm as hc

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]


def rank_values(r, shape=(3, 4), dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * r).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_ops_exact(world, dtype):
    r, n = world
    x = rank_values(r, dtype=dtype)
    allv = [rank_values(k, dtype=dtype).astype(np.float64) for k in range(n)]
    np.testing.assert_array_equal(hc.allreduce(x, hc.Sum), sum(allv).astype(dtype))
    np.testing.assert_array_equal(hc.allreduce(x, hc.Min), np.min(allv, 0).astype(dtype))
    np.testing.assert_array_equal(hc.allreduce(x, hc.Max), np.max(allv, 0).astype(dtype))
    small = (np.arange(12).reshape(3, 4) % 3 + r % 2 + 1).astype(dtype)
    expected = np.prod([(np.arange(12).reshape(3, 4) % 3 + k % 2 + 1) for k in range(n)], 0)
    np.testing.assert_array_equal(hc.allreduce(small, hc.Product), expected.astype(dtype))
    avg = hc.allreduce(x, hc.Average)
    if np.issubdtype(dtype, np.floating):
        np.testing.assert_allclose(avg, sum(allv) / n, rtol=1e-3 if dtype == np.float16 else 1e-6)
    else:
        np.testing.assert_array_equal(avg, (sum(allv) // n).astype(dtype))
    assert avg.dtype == dtype and avg.shape == x.shape


def test_allreduce_scale_factors(world):
    r, n = world
    out = hc.allreduce(np.full(5, r + 1.0), hc.Sum, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_array_equal(out, np.full(5, n * (n + 1) / 2))


def test_allreduce_does_not_modify_input(world):
    x = np.ones(100, np.float32)
    hc.allreduce(x, hc.Sum)
    np.testing.assert_array_equal(x, np.ones(100))


@pytest.mark.parametrize("threshold", ["0", "64", "64MiB"])
def test_grouped_allreduce_fusion(world, monkeypatch, threshold):
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", threshold)
    r, n = world
    shapes = [(3,), (2, 5), (), (7, 1, 2), (0,), (1000,)]
    dtypes = [np.float32, np.float64, np.float32, np.int32, np.float32, np.float32]
    arrays = [np.full(s, r + i, dt) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    out = hc.grouped_allreduce(arrays, hc.Sum)
    for i, (o, a) in enumerate(zip(out, arrays)):
        assert o.shape == a.shape and o.dtype == a.dtype
        np.testing.assert_array_equal(o, np.full(a.shape, sum(k + i for k in range(n))))


def test_results_stay_valid_while_held(world):
    """Pooled buffers are not reused while a result is alive."""
    r, n = world
    first = hc.allreduce(np.full(64, r, np.float32), hc.Sum)
    second = hc.allreduce(np.full(64, 1.0, np.float32), hc.Sum)
    np.testing.assert_array_equal(first, np.full(64, n * (n - 1) / 2))
    np.testing.assert_array_equal(second, np.full(64, n))


def test_allgather_variable_first_dim(world):
    r, n = world
    x = np.full((r + 1, 3), r, np.int64)
    out = hc.allgather(x)
    expected = np.concatenate([np.full((k + 1, 3), k) for k in range(n)])
    np.testing.assert_array_equal(out, expected)
    g, rows = hc.allgatherv(x)
    np.testing.assert_array_equal(rows, np.arange(1, n + 1))


def test_grouped_allgather(world):
    r, n = world
    a, b = hc.grouped_allgather([np.array([r]), np.full((2, 2), r, np.float32)])
    np.testing.assert_array_equal(a, np.arange(n))
    np.testing.assert_array_equal(b, np.repeat(np.arange(n), 2)[:, None] * np.ones((1, 2)))


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast(world, root):
    r, n = world
    root = root % n
    out = hc.broadcast(rank_values(r), root)
    np.testing.assert_array_equal(out, rank_values(root))
    many = hc.grouped_broadcast([np.full(3, r), np.full((2, 2), r * 1.5)], root)
    np.testing.assert_array_equal(many[0], np.full(3, root))
    np.testing.assert_array_equal(many[1], np.full((2, 2), root * 1.5))


def test_alltoall_even_and_splits(world):
    r, n = world
    x = np.arange(2 * n) + 100 * r
    out, received = hc.alltoall(x)
    np.testing.assert_array_equal(received, np.full(n, 2))
    np.testing.assert_array_equal(out, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * k
                                                       for k in range(n)]))
    # Rank r sends j+1 rows to rank j.
    splits = np.arange(1, n + 1)
    x = np.full((splits.sum(), 2), r, np.float32)
    out, received = hc.alltoall(x, splits)
    np.testing.assert_array_equal(received, np.full(n, r + 1))
    np.testing.assert_array_equal(out, np.repeat(np.arange(n), r + 1)[:, None] * np.ones((1, 2)))


def test_reducescatter(world):
    r, n = world
    rows = 2 * n + 1
    x = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) * (r + 1)
    out = hc.reducescatter(x, hc.Sum)
    total = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) * n * (n + 1) / 2
    counts = [rows // n + (k < rows % n) for k in range(n)]
    start = sum(counts[:r])
    np.testing.assert_array_equal(out, total[start:start + counts[r]])
    avg = hc.reducescatter(x, hc.Average)
    np.testing.assert_allclose(avg, total[start:start + counts[r]] / n)


def test_objects_and_barrier(world):
    r, n = world
    assert hc.broadcast_object({"rank": r, "list": [r]}, root_rank=n - 1) == {"rank": n - 1,
                                                                              "list": [n - 1]}
    assert hc.allgather_object(("r", r)) == [("r", k) for k in range(n)]
    hc.barrier()


def test_topology(world):
    r, n = world
    assert hc.rank() == r and 0 <= hc.local_rank() < hc.local_size() <= n
    assert hc.cross_size() * hc.local_size() == n  # one node here
    assert hc.is_homogeneous()
