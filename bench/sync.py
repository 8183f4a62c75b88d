"""Gradient synchronisers the benchmark swaps under the same model step.

- ``hpcrep``: :class:`hpcrep.tensorflow.gradients.GradientReducer` (what ``DistributedOptimizer``
  and ``DistributedGradientTape`` use), one fused allreduce per call, inside ``tf.function``;
- ``nosync``: no communication at all, the upper bound of any synchroniser;
- ``mpi4py``: the raw baseline as a competent user writes it (:class:`RawAverager`): one flat
  float32 buffer allocated once per gradient set and reused, each tensor's slot starting on a
  64-byte boundary, the gradients copied in already scaled by ``1/size`` (one pass), one
  ``MPI.COMM_WORLD.Allreduce(IN_PLACE)``, and aligned views of the buffer handed back;
- ``horovod``: ``horovod.tensorflow.grouped_allreduce`` (op=Average) inside ``tf.function``,
  ``tf.IndexedSlices`` densified first (see :func:`_dense`);
  Horovod lives in ``.venv-peers/`` (``make peers``), and ``hpcrep bench`` runs this mode's jobs
  under that venv's Python (see bench/README.md, section Horovod).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

MODES = ("hpcrep", "nosync", "mpi4py", "horovod")

Synchronizer = Callable[[Sequence[tf.Tensor]], list]


def make_synchronizer(mode: str) -> Synchronizer:
    """Return a function that averages a list of gradient tensors across ranks.

    Collective (modes hpcrep and mpi4py): every rank must call the returned function, in the same
    order, with matching tensors.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    if mode == "hpcrep":
        from hpcrep.tensorflow.gradients import GradientReducer  # noqa: PLC0415

        reducer = GradientReducer()
        return tf.function(lambda grads: reducer.reduce(list(grads), name="bench_grads"),
                           autograph=False)
    if mode == "nosync":
        return lambda grads: list(grads)
    if mode == "mpi4py":
        return _mpi4py_average
    if mode == "horovod":
        import horovod.tensorflow as horovod  # noqa: PLC0415

        horovod.init()
        return tf.function(lambda grads: horovod.grouped_allreduce(
            [_dense(g) for g in grads], op=horovod.Average))
    raise ValueError(f"unknown synchronisation mode {mode!r}; expected one of {', '.join(MODES)}")


def _dense(grad):
    """``grad`` as a dense tensor. Horovod 0.28.1's ``grouped_allreduce`` fails on a list that
    mixes ``tf.IndexedSlices`` with dense tensors (it pairs each slice with the ``dense_shape`` of
    the tensor at the same position in the whole list), so the horovod mode densifies them, as
    ``DistributedOptimizer(sparse_as_dense=True)`` would."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _mpi4py_average(grads: Sequence[tf.Tensor]) -> list:
    # Embedding-style gradients arrive as tf.IndexedSlices: densify, as a hand-written
    # baseline would.
    arrays = [np.asarray(tf.convert_to_tensor(g), dtype=np.float32) for g in grads]
    return [tf.constant(a) for a in average_arrays(arrays)]


ALIGN = 64  # bytes: a cache line, and what TensorFlow needs to use a numpy buffer without a copy


def aligned_layout(sizes: Sequence[int], align: int = ALIGN) -> tuple[list[int], int]:
    """Offsets (in float32 elements) of slots of ``sizes`` elements, each starting on an
    ``align``-byte boundary, and the total elements. Local."""
    step = align // 4
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-int(n) // step) * step
    return offsets, total


def aligned_empty(count: int, align: int = ALIGN) -> np.ndarray:
    """An uninitialised float32 array of ``count`` elements whose data starts on an
    ``align``-byte boundary. Local."""
    raw = np.empty(count * 4 + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + count * 4].view(np.float32)


class RawAverager:
    """The raw mpi4py baseline: averages lists of float32 arrays through one reused, aligned
    buffer per list shape, ``1/size`` folded into the copy in, one in-place ``Allreduce``.

    Collective: every rank must call :meth:`average` in the same order, with arrays of the same
    shapes. The returned arrays are views of the buffer, valid until the next call with the
    same shapes (the training step consumes them before its next exchange).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, tuple[np.ndarray, list[int]]] = {}

    def average(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Return the average over ranks of ``arrays`` (see the class docstring)."""
        from mpi4py import MPI  # noqa: PLC0415

        world = MPI.COMM_WORLD
        size = world.Get_size()
        key = tuple(tuple(np.shape(a)) for a in arrays)
        if key not in self._buffers:
            offsets, total = aligned_layout([int(np.size(a)) for a in arrays])
            self._buffers[key] = (aligned_empty(total), offsets)
        buf, offsets = self._buffers[key]
        scale = np.float32(1.0 / size)
        views = []
        for a, off in zip(arrays, offsets):
            view = buf[off:off + int(np.size(a))]
            np.multiply(np.asarray(a, np.float32).reshape(-1), scale, out=view)
            views.append(view.reshape(np.shape(a)))
        if size > 1:
            world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        return views


_AVERAGER = RawAverager()


def average_arrays(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The raw baseline on numpy (:class:`RawAverager`, one per process).

    Collective: every rank must call this, in the same order, with arrays of the same shapes.
    """
    return _AVERAGER.average(arrays)
