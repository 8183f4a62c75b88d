"""Fusion plans, packing and the buffer pool, exactly: the gaps mutation testing found.

`make mutation` showed that the tests beside these (test_fusion_and_check.py) let through a
fusion plan with other padding or a bucket boundary one element off, packing that drops the
scale or casts a wrongly typed array silently, and a pool that never reuses a buffer. These pin
the exact layout and the round trip through pack and unpack. No MPI.
"""

import numpy as np
import pytest

from hpcrep.comm import fusion


@pytest.mark.parametrize("count, itemsize, padded", [
    (0, 4, 0), (1, 4, 16), (16, 4, 16), (17, 4, 32), (3, 8, 8), (9, 8, 16), (1, 1, 64),
    (65, 1, 128), (1, 2, 32), (5, 128, 5),  # an item wider than ALIGN needs no padding
])
def test_padded_count_rounds_up_to_whole_aligned_blocks(count, itemsize, padded):
    got = fusion.padded_count(count, itemsize)
    assert got == padded and isinstance(got, int)


def test_plan_offsets_lengths_and_bucket_order_exactly():
    layout = (((2, 3), "float64"), ((), "float32"), ((0,), "float32"), ((5,), "float64"),
              ((20,), "float32"), ((7,), "int8"))
    buckets = fusion._plan(layout, 1 << 20)
    # One bucket per dtype, ordered by the call position of its first array.
    assert [b.dtype for b in buckets] == [np.dtype("float64"), np.dtype("float32"),
                                         np.dtype("int8")]
    f64, f32, i8 = buckets
    assert f64.slots == (fusion.Slot(0, 0, 6), fusion.Slot(3, 8, 5)) and f64.length == 16
    # A scalar is one element; an empty array takes no room and starts where the next does.
    assert f32.slots == (fusion.Slot(1, 0, 1), fusion.Slot(2, 16, 0), fusion.Slot(4, 16, 20))
    assert f32.length == 48
    assert i8.slots == (fusion.Slot(5, 0, 7),) and i8.length == 64


def test_plan_closes_a_bucket_only_past_the_threshold():
    layout = tuple(((16,), "float32") for _ in range(3))  # 64 bytes each
    exact = fusion._plan(layout, 128)  # two fit exactly, the third opens a new bucket
    assert [[s.index for s in b.slots] for b in exact] == [[0, 1], [2]]
    assert [[s.offset for s in b.slots] for b in exact] == [[0, 16], [0]]
    assert [b.length for b in exact] == [32, 16]
    assert [len(b.slots) for b in fusion._plan(layout, 127)] == [1, 1, 1]
    assert [len(b.slots) for b in fusion._plan(layout, -1)] == [1, 1, 1]
    # Buckets of different dtypes close independently, and come out in call order.
    mixed = ((((16,), "float32"),) + (((8,), "float64"),) + (((16,), "float32"),) * 2)
    got = fusion._plan(mixed, 128)
    assert [[s.index for s in b.slots] for b in got] == [[0, 2], [1], [3]]


def test_plan_is_cached_and_equal_to_the_uncached_plan():
    layout = (((4,), "float32"), ((3,), "float16"))
    assert fusion.plan(layout, 1024) is fusion.plan(layout, 1024)
    assert fusion.plan(layout, 1024) == fusion._plan(layout, 1024)


def test_pack_and_unpack_round_trip_with_and_without_scale():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.float32(7.0),
              np.linspace(0, 1, 17, dtype=np.float32)]
    (bucket,) = fusion.plan(tuple((a.shape, a.dtype.name) for a in map(np.asarray, arrays)),
                            1 << 20)
    buf = fusion.pack(bucket, arrays).hand_over()  # results are views of it
    assert buf.dtype == np.float32 and buf.shape == (bucket.length,)
    out = [None] * 3
    fusion.unpack(bucket, buf, [np.shape(a) for a in arrays], out)
    for got, want in zip(out, arrays):
        assert got.shape == np.shape(want) and np.array_equal(got, want)
        assert np.shares_memory(got, buf)  # views, not copies
    halved = fusion.pack(bucket, arrays, scale=0.5).hand_over()
    assert not np.shares_memory(halved, buf)  # buf's views are alive: a new buffer
    fusion.unpack(bucket, halved, [np.shape(a) for a in arrays], out)
    for got, want in zip(out, arrays):
        assert np.array_equal(got, np.asarray(want) * 0.5)


def test_pack_without_fill_copies_nothing_and_never_casts(monkeypatch):
    monkeypatch.setattr(fusion, "POOL", fusion.BufferPool())  # no free buffer of other tests
    arrays = [np.full(4, 3.0, dtype=np.float32)]
    (bucket,) = fusion.plan((((4,), "float32"),), 1024)
    marker = fusion.pack(bucket, arrays).hand_over()
    marker[:] = -1.0
    address = marker.ctypes.data
    del marker
    empty = fusion.pack(bucket, arrays, fill=False).hand_over()  # the pool's buffer, left as it was
    assert empty.ctypes.data == address and np.all(empty == -1.0)
    del empty
    with pytest.raises(TypeError):  # float64 into a float32 bucket: refused, not cast
        fusion.pack(bucket, [np.zeros(4, dtype=np.float64)])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8"])
def test_pool_hands_out_exactly_the_length_asked_for_aligned(dtype):
    pool = fusion.BufferPool()
    for length in (0, 1, 33, 1000):
        buf = pool.take(np.dtype(dtype), length).hand_over()
        assert buf.dtype == np.dtype(dtype) and buf.shape == (length,)
        assert length == 0 or buf.ctypes.data % fusion.ALIGN == 0  # (an empty view has no data)


def test_pool_gives_back_the_same_buffer_once_free_and_keeps_a_bounded_number():
    pool = fusion.BufferPool(keep_per_size=2)
    a = pool.take(np.dtype(np.float32), 8).hand_over()
    a[:] = 5.0
    address = a.ctypes.data
    del a
    again = pool.take(np.dtype(np.float32), 8).hand_over()
    # The very buffer (values left in it), not a new zero-filled one at the same address.
    assert again.ctypes.data == address and np.all(again == 5.0)
    alive = [again] + [pool.take(np.dtype(np.float32), 8).hand_over() for _ in range(3)]
    assert len({b.ctypes.data for b in alive}) == 4
    assert pool.on_loan() == 4
    del again, alive  # all four come back; the pool keeps two of them
    assert pool.on_loan() == 0
    assert [len(v) for v in pool._free.values()] == [2]


def test_pack_scales_integer_tensors_in_their_own_dtype(monkeypatch):
    monkeypatch.setattr(fusion, "POOL", fusion.BufferPool())
    arrays = [np.array([1, 2, 3], dtype=np.int32)]
    (bucket,) = fusion.plan((((3,), "int32"),), 1024)
    buf = fusion.pack(bucket, arrays, scale=2.0).hand_over()
    assert buf.dtype == np.int32 and buf[:3].tolist() == [2, 4, 6]
