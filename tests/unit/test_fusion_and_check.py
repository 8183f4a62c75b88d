"""Fusion plans, the buffer pool and mismatch messages, without MPI."""

import numpy as np

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


def test_pool_reuses_only_free_buffers():
    pool = fusion.BufferPool()
    a = pool.take(np.dtype(np.float32), 100)
    assert a.ctypes.data % fusion.ALIGN == 0
    b = pool.take(np.dtype(np.float32), 100)
    assert not np.shares_memory(a, b)  # a is alive, so b is new
    address = a.ctypes.data
    del a
    c = pool.take(np.dtype(np.float32), 100)
    assert c.ctypes.data == address  # a's buffer came back


def test_pool_never_hands_one_dtypes_bytes_to_another():
    pool = fusion.BufferPool()
    a = pool.take(np.dtype(np.float32), 16)  # 64 bytes
    a[:] = 1e30  # as float16 bits these would be inf/NaN
    del a
    h = pool.take(np.dtype(np.float16), 32)  # also 64 bytes
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
