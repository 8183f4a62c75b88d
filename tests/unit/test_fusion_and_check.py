"""Fusion plans, the buffer pool and mismatch messages, without MPI."""

import numpy as np
import pytest

from hpcrep.comm import check, fusion


def test_plan_packs_by_dtype_in_call_order_and_aligns():
    layout = (((3,), "float32"), ((5,), "float64"), ((2, 2), "float32"), ((1000,), "float32"))
    buckets = fusion.plan(layout, 64 << 20)
    assert [[s.index for s in b.slots] for b in buckets] == [[0, 2, 3], [1]]
    f32 = buckets[0]
    assert [s.offset for s in f32.slots] == [0, 16, 32]  # 64-byte aligned (16 floats)
    assert all(s.offset * 4 % fusion.ALIGN == 0 for s in f32.slots)


def test_plan_threshold_splits_buckets():
    layout = tuple(((256,), "float32") for _ in range(4))  # 1 KiB each
    assert len(fusion.plan(layout, 2048)) == 2
    assert len(fusion.plan(layout, 0)) == 4
    big = (((10_000,), "float32"),)
    assert len(fusion.plan(big, 1024)) == 1  # a large array gets its own bucket


def _address(array):
    return array.__array_interface__["data"][0]


def test_a_leased_buffer_is_never_lent_twice_and_a_returned_one_is_reused():
    pool = fusion.BufferPool()
    f32 = np.dtype(np.float32)
    first = pool.take(f32, 100)
    a = first.array
    assert _address(a) % fusion.ALIGN == 0 and a.shape == (100,) and a.dtype == f32
    others = [pool.take(f32, 100) for _ in range(6)]  # more than the pool keeps per size
    assert all(not np.shares_memory(a, o.array) for o in others)
    assert len({_address(o.array) for o in others}) == 6
    assert pool.on_loan() == 7
    address = _address(a)
    del a  # dropping a local reference returns nothing: only release() does
    assert all(_address(pool.take(f32, 100).hand_over()) != address for _ in range(3))
    first.release()
    first.release()  # twice: nothing more happens
    again = pool.take(f32, 100)
    assert _address(again.array) == address  # the returned buffer is lent again
    assert _address(pool.take(f32, 100).array) != address  # and only once
    with pool.take(np.dtype(np.float64), 50) as scratch:  # a context manager returns it too
        scratch_address = _address(scratch)
    assert _address(pool.take(np.dtype(np.float64), 50).array) == scratch_address


def test_a_handed_over_buffer_returns_only_when_its_last_view_is_gone():
    pool = fusion.BufferPool()
    f32 = np.dtype(np.float32)
    lease = pool.take(f32, 64)
    buf = lease.hand_over()
    address = _address(buf)
    view = buf[16:32].reshape(4, 4)  # a result, as unpack makes them
    further = view.T.view(np.int32)  # a view of a view
    del buf, lease, view
    assert pool.on_loan() == 1
    held = pool.take(f32, 64)
    assert not np.shares_memory(held.array, further)  # the views still hold it
    held.release()
    further[:] = 7
    del further
    assert pool.on_loan() == 0
    assert {_address(pool.take(f32, 64).array) for _ in range(2)} >= {address}
    with pytest.raises(RuntimeError, match="handed over"):
        handed = pool.take(f32, 64)
        handed.hand_over()
        handed.release()


def test_pool_never_hands_one_dtypes_bytes_to_another():
    pool = fusion.BufferPool()
    with pool.take(np.dtype(np.float32), 16) as a:  # 64 bytes
        a[:] = 1e30  # as float16 bits these would be inf/NaN
    h = pool.take(np.dtype(np.float16), 32).array  # also 64 bytes
    assert np.all(h == 0)


def test_mismatch_message_names_tensor_and_groups_ranks():
    sig = lambda shape, name="w": ("allreduce", ("Sum",), ((name, "float32", shape),))  # noqa
    msg = check.mismatch_message([sig((3,)), sig((4,)), sig((4,)), sig((3,))])
    assert "tensor 'w' (position 0 of 1)" in msg
    assert "ranks 0, 3 passed float32[3]" in msg and "ranks 1, 2 passed float32[4]" in msg


def test_hash_ignores_names_but_not_shapes():
    a = ("allreduce", (), (("x", "float32", (3,)),))
    b = ("allreduce", (), (("y", "float32", (3,)),))
    c = ("allreduce", (), (("x", "float32", (4,)),))
    assert check.signature_hash(a) == check.signature_hash(b) != check.signature_hash(c)


def test_chunks_cut_buffers_at_the_chunk_size_and_cover_every_item():
    from hpcrep.comm.collectives import chunks

    pieces = chunks(1000, 4, 1024)  # 256 items each, the last one short
    assert [(p.start, p.stop) for p in pieces] == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert [(p.start, p.stop) for p in chunks(1000, 4, 0)] == [(0, 1000)]  # 0: no limit
    assert [(p.start, p.stop) for p in chunks(3, 8, 4)] == [(0, 1), (1, 2), (2, 3)]  # >= 1 item
    assert len(chunks(0, 4, 1024)) == 1  # an empty buffer still takes part, once
