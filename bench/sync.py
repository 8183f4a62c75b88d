"""Gradient synchronisers the benchmark swaps under the same model step.

- ``hpcrep``: :class:`hpcrep.tensorflow.gradients.GradientReducer` (what ``DistributedOptimizer``
  and ``DistributedGradientTape`` use), one fused allreduce per call, inside ``tf.function``;
- ``nosync``: no communication at all, the upper bound of any synchroniser;
- ``mpi4py``: the raw baseline written by hand: tensors to numpy, packed into one flat buffer,
  one ``MPI.COMM_WORLD.Allreduce(IN_PLACE)``, divided by the size and split back;
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


def average_arrays(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The raw baseline on numpy: pack into one flat float32 buffer, one
    ``MPI.COMM_WORLD.Allreduce(IN_PLACE)``, divide by the size, split back into the shapes.

    Collective: every rank must call this, in the same order, with arrays of the same shapes.
    """
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return [np.asarray(a, np.float32) for a in arrays]
    flat = np.concatenate([np.asarray(a, np.float32).ravel() for a in arrays])
    world.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    flat /= world.Get_size()
    out, offset = [], 0
    for a in arrays:
        out.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return out
