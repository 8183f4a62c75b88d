"""Tensor fusion: many arrays packed into few aligned buffers, in an order every rank agrees on.

A *plan* assigns each array a 64-byte-aligned slot in a bucket; buckets hold one dtype and at most
``threshold`` bytes (an array larger than that gets a bucket of its own). The plan depends only on
the arrays' shapes and dtypes in call order, which :mod:`hpcrep.comm.check` has verified are equal
on every rank, so every rank builds the same plan.

Buckets live in a :class:`BufferPool`, which lends them: :meth:`BufferPool.take` hands out a
:class:`Lease`, and its buffer goes to nobody else until the lease is returned. A buffer used only
inside one call (a send buffer, a reduce-scatter share) is returned by :meth:`Lease.release` (or
by leaving ``with``) once the last MPI call on it is done. A buffer whose views become results
(one copy in, by packing, and none out) is handed over with :meth:`Lease.hand_over`: it returns to
the pool when the last of those views is gone, which the pool learns from a finalizer on an
object that every view keeps alive (never from reference counts, which CPython 3.14 no longer
makes exact for locals). TensorFlow keeps the numpy arrays it receives from
``tf.numpy_function`` alive for exactly as long as the tensors that alias them, so a buffer under
live tensors is never lent again either.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import threading
import weakref
from typing import Any, Optional, Sequence

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


class Lease:
    """One buffer of a :class:`BufferPool` on loan: ``array``, 1-D, aligned, for this lease alone.

    Return it exactly one way: :meth:`release` (or ``with lease as buf:``) once nothing uses the
    buffer any more, or :meth:`hand_over` to let views of it outlive the call. A lease dropped
    without either acts as handed over.
    """

    def __init__(self, pool: "BufferPool", key: tuple[str, int], raw: np.ndarray, start: int,
                 dtype: np.dtype, length: int) -> None:
        # ``raw`` is aligned from byte ``start`` on. Every view of ``array`` keeps ``token``
        # alive (numpy stops its chain of bases at a non-array buffer), so the token dies with
        # the last view, and its finalizer returns raw.
        token = (ctypes.c_char * max(1, length * dtype.itemsize)).from_buffer(raw, start)
        self.array: Optional[np.ndarray] = np.frombuffer(token, dtype=dtype, count=length)
        self._returned = weakref.finalize(token, pool._give_back, key, raw, start)
        self._returned.atexit = False  # nothing to give back when the interpreter ends
        self._handed_over = False

    def release(self) -> None:
        """Return the buffer to the pool now. Local.

        Only when no view of it is used any more: the next :meth:`BufferPool.take` of its size
        may hand it out and overwrite it. Releasing twice does nothing.

        Raises:
            RuntimeError: the buffer was handed over (its views decide when it returns).
        """
        if self._handed_over:
            raise RuntimeError("this fusion buffer was handed over: it returns to the pool when "
                               "its last view is gone, not by release()")
        self.array = None
        self._returned()  # runs the finalizer now, once; later deaths of views do nothing

    def hand_over(self) -> np.ndarray:
        """Return the buffer for results that outlive the call: it goes back to the pool only
        once the last view of it is gone (the caller's arrays, or the tensors TensorFlow made
        of them). Local."""
        array, self.array = self.array, None
        if array is None:
            raise RuntimeError("this fusion buffer lease was already released or handed over")
        self._handed_over = True
        return array

    def __enter__(self) -> np.ndarray:
        if self.array is None:
            raise RuntimeError("this fusion buffer lease was already released or handed over")
        return self.array

    def __exit__(self, *exc: Any) -> None:
        self.release()


class BufferPool:
    """Zero-filled, 64-byte-aligned buffers, lent out (:class:`Lease`) and reused once returned."""

    def __init__(self, keep_per_size: int = 4) -> None:
        self._free: dict[tuple[str, int], list[tuple[np.ndarray, int]]] = {}  # (raw, start)
        self._keep = keep_per_size
        self._on_loan = 0
        # Reentrant: a finalizer (a view's death, under the garbage collector) may return a buffer
        # while this thread is inside take().
        self._lock = threading.RLock()

    def take(self, dtype: np.dtype, length: int) -> Lease:
        """Lend a 1-D aligned array of ``length`` elements of ``dtype`` that nobody else holds.

        A returned buffer of the same dtype and size is lent again; otherwise a new one is made.
        Buffers start zero-filled and are reused only for the same dtype and size, so padding
        between slots holds zeros or values of an earlier layout of that dtype, never another
        dtype's bytes (float32 bytes read as float16 can be inf or NaN, and reducing them warned
        of overflow). Packing never reads padding back. Local.
        """
        key = (dtype.str, max(1, length * dtype.itemsize))
        with self._lock:
            free = self._free.get(key)
            raw, start = free.pop() if free else (None, 0)
            self._on_loan += 1
        if raw is None:
            raw = np.zeros(key[1] + ALIGN, dtype=np.uint8)
            start = (-raw.__array_interface__["data"][0]) % ALIGN
        return Lease(self, key, raw, start, dtype, length)

    def on_loan(self) -> int:
        """Return how many buffers are lent out and not yet returned. Local."""
        with self._lock:
            return self._on_loan

    def _give_back(self, key: tuple[str, int], raw: np.ndarray, start: int) -> None:
        """Take ``raw`` back (from a lease's finalizer); keep at most ``keep_per_size`` free."""
        with self._lock:
            self._on_loan -= 1
            free = self._free.setdefault(key, [])
            if len(free) < self._keep:
                free.append((raw, start))


POOL = BufferPool()


def pack(bucket: Bucket, arrays: Sequence[np.ndarray], scale: float = 1.0,
         fill: bool = True) -> Lease:
    """Lend a pooled buffer for ``bucket``; with ``fill``, ``arrays`` copied in (times
    ``scale``). The caller returns the lease (see :class:`Lease`)."""
    lease = POOL.take(bucket.dtype, bucket.length)
    buf = lease.array
    if fill:
        for slot in bucket.slots:
            dst = buf[slot.offset:slot.offset + slot.count]
            src = np.asarray(arrays[slot.index]).reshape(-1)
            if scale == 1.0:
                np.copyto(dst, src, casting="no")
            else:
                np.multiply(src, scale, out=dst, casting="unsafe")
    return lease


def unpack(bucket: Bucket, buf: np.ndarray, shapes: Sequence[tuple[int, ...]],
           out: list) -> None:
    """Store views of ``buf`` into ``out[slot.index]``, shaped as the caller's arrays were."""
    for slot in bucket.slots:
        out[slot.index] = buf[slot.offset:slot.offset + slot.count].reshape(shapes[slot.index])
