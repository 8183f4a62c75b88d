"""Tensor fusion: many arrays packed into few aligned buffers, in an order every rank agrees on.

A *plan* assigns each array a 64-byte-aligned slot in a bucket; buckets hold one dtype and at most
``threshold`` bytes (an array larger than that gets a bucket of its own). The plan depends only on
the arrays' shapes and dtypes in call order, which :mod:`hpcrep.comm.check` has verified are equal
on every rank, so every rank builds the same plan.

Buckets live in a :class:`BufferPool`. Results are returned as views into the bucket, so there is
one copy in (packing) and none out; a bucket is reused only once no view of it is alive, which the
pool tells from the buffer's reference count. TensorFlow keeps the numpy arrays it receives from
``tf.numpy_function`` alive for exactly as long as the tensors that alias them, so this also holds
for tensors.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from typing import Sequence

import numpy as np

ALIGN = 64  # bytes; TensorFlow aliases (does not copy) numpy outputs aligned to this.


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where array ``index`` of a call lives in its bucket."""

    index: int
    offset: int  # in elements of the bucket's dtype
    count: int   # elements


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One fusion buffer: a dtype, a length in elements, and the slots packed into it."""

    dtype: np.dtype
    length: int
    slots: tuple[Slot, ...]


def padded_count(count: int, itemsize: int) -> int:
    """Return ``count`` rounded up so that ``count * itemsize`` is a multiple of ALIGN bytes."""
    per = max(1, ALIGN // itemsize)
    return -(-count // per) * per


def _plan(layout: tuple[tuple[tuple[int, ...], str], ...], threshold: int) -> tuple[Bucket, ...]:
    """Return the buckets for arrays of the given ``(shape, dtype name)`` in call order.

    Arrays of one dtype are packed in call order; a bucket is closed when the next array would
    take it past ``threshold`` bytes. ``threshold <= 0`` gives every array its own bucket.
    """
    open_slots: dict[str, list[Slot]] = {}
    open_len: dict[str, int] = {}
    buckets: list[Bucket] = []

    def close(dtype_name: str) -> None:
        slots = open_slots.pop(dtype_name, [])
        if slots:
            buckets.append(Bucket(np.dtype(dtype_name), open_len.pop(dtype_name), tuple(slots)))

    for index, (shape, dtype_name) in enumerate(layout):
        itemsize = np.dtype(dtype_name).itemsize
        count = int(np.prod(shape, dtype=np.int64))
        padded = padded_count(count, itemsize)
        used = open_len.get(dtype_name, 0)
        if used and (threshold <= 0 or (used + padded) * itemsize > threshold):
            close(dtype_name)
            used = 0
        open_slots.setdefault(dtype_name, []).append(Slot(index, used, count))
        open_len[dtype_name] = used + padded
    for dtype_name in list(open_slots):
        close(dtype_name)
    # Buckets complete in dtype-then-order of closing; sort by first slot so the order depends on
    # the call order alone.
    buckets.sort(key=lambda b: b.slots[0].index)
    return tuple(buckets)


# Cached by wrapping rather than by decorating ``_plan``: mutmut (make mutation) skips decorated
# functions, and the plan is one of the things it must mutate.
plan = functools.lru_cache(maxsize=1024)(_plan)


class BufferPool:
    """Zero-filled, 64-byte-aligned buffers, reused once nothing outside the pool refers to them."""

    def __init__(self, keep_per_size: int = 4) -> None:
        self._free: dict[tuple[str, int], list[np.ndarray]] = {}
        self._keep = keep_per_size
        self._lock = threading.Lock()

    def take(self, dtype: np.dtype, length: int) -> np.ndarray:
        """Return a 1-D aligned array of ``length`` elements of ``dtype`` that nobody else uses.

        Buffers start zero-filled and are reused only for the same dtype and size, so padding
        between slots holds zeros or values of an earlier layout of that dtype, never another
        dtype's bytes (float32 bytes read as float16 can be inf or NaN, and reducing them warned
        of overflow). Packing never reads padding back.
        """
        nbytes = max(1, length * dtype.itemsize)
        with self._lock:
            owners = self._free.setdefault((dtype.str, nbytes), [])
            raw = None
            for candidate in owners:
                # References: the list, this loop variable, getrefcount's argument. Any more
                # means a view handed out earlier is still alive.
                if sys.getrefcount(candidate) <= 3:
                    raw = candidate
                    break
            if raw is None:
                raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
                if len(owners) < self._keep:
                    owners.append(raw)
        start = (-raw.ctypes.data) % ALIGN
        return raw[start:start + length * dtype.itemsize].view(dtype)


POOL = BufferPool()


def pack(bucket: Bucket, arrays: Sequence[np.ndarray], scale: float = 1.0,
         fill: bool = True) -> np.ndarray:
    """Return a pooled buffer for ``bucket``; with ``fill``, ``arrays`` copied in (times
    ``scale``)."""
    buf = POOL.take(bucket.dtype, bucket.length)
    if fill:
        for slot in bucket.slots:
            dst = buf[slot.offset:slot.offset + slot.count]
            src = np.asarray(arrays[slot.index]).reshape(-1)
            if scale == 1.0:
                np.copyto(dst, src, casting="no")
            else:
                np.multiply(src, scale, out=dst, casting="unsafe")
    return buf


def unpack(bucket: Bucket, buf: np.ndarray, shapes: Sequence[tuple[int, ...]],
           out: list) -> None:
    """Store views of ``buf`` into ``out[slot.index]``, shaped as the caller's arrays were."""
    for slot in bucket.slots:
        out[slot.index] = buf[slot.offset:slot.offset + slot.count].reshape(shapes[slot.index])
