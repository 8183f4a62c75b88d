"""Collectives on TensorFlow tensors, with gradients, eagerly and inside ``tf.function``.

Each function has the name, arguments and semantics of its ``horovod.tensorflow`` counterpart and
is collective: every rank must call it, in the same order, with tensors of the same dtype and
shape (allgather and alltoall: all but the first dimension). Mismatches raise on every rank.

Each runs on ``process_set`` (a :class:`hpcrep.comm.ProcessSet`, a
:class:`hpcrep.comm.Communicator` or None for :func:`hpcrep.comm.current`), resolved when the op is built (at trace time inside
``tf.function``) and handed to the host callback, which TensorFlow runs on a thread of its own.

Gradients: allreduce's gradient is the same allreduce of the upstream gradient (Min/Max route it
to the ranks that held the extreme); allgather's is the summed gradient's rows of this rank;
broadcast's is the summed gradient on the root and zero elsewhere; alltoall's sends gradients back
along the received splits; reducescatter's is an allgather.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow import fused
from hpcrep.tensorflow.bridge import host_call, require_no_xla
from hpcrep.tensorflow.compression import Compression, Compressor


def _resolve_op(average: Optional[bool], op: Any) -> ReduceOp:
    if average is not None and op is not None:
        raise CollectiveArgumentError(
            "pass either average= (deprecated) or op=, not both; use op=hvd.Average or op=hvd.Sum")
    if op is None:
        return ReduceOp.Average if average is None or average else ReduceOp.Sum
    return as_reduce_op(op)


def _host_grouped_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, pre: float, post: float,
                            name: Optional[str], communicator: comm.Communicator
                            ) -> list[tf.Tensor]:
    if communicator.size() == 1 and (pre * post == 1.0
                                     or all(t.dtype.is_floating for t in tensors)):
        # One rank: every reduction is the identity, so skip the host round trip entirely.
        require_no_xla("hpcrep_allreduce")
        scale = pre * post
        return [tf.identity(t) if scale == 1.0 else t * tf.cast(scale, t.dtype) for t in tensors]
    if fused.can_fuse(tensors):
        return fused.fused_allreduce(tensors, op, pre, post, name, communicator)

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        return comm.grouped_allreduce(arrays, op, pre, post, name, communicator)

    return host_call(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                     name="hpcrep_allreduce")


def _grouped_allreduce_with_grad(tensors: Sequence[tf.Tensor], op: ReduceOp, pre: float,
                                 post: float, name: Optional[str],
                                 communicator: comm.Communicator) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor):
        ys = _host_grouped_allreduce(xs, op, pre, post, name, communicator)

        def backward(*dys: tf.Tensor):
            dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(ys, dys)]
            if op in (ReduceOp.Sum, ReduceOp.Average):
                return _host_grouped_allreduce(dys, op, pre, post, _grad_name(name), communicator)
            summed = _host_grouped_allreduce(dys, ReduceOp.Sum, 1.0, 1.0, _grad_name(name),
                                             communicator)
            if op is ReduceOp.Product:
                return [s * tf.math.divide_no_nan(y, x) for s, x, y in zip(summed, xs, ys)]
            return [s * tf.cast(tf.equal(x, y), s.dtype) for s, x, y in zip(summed, xs, ys)]

        return ys, backward

    return list(forward(*tensors))


def _grad_name(name: Optional[str]) -> Optional[str]:
    return None if name is None else f"{name}_grad"


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, process_set: Any = None,
                      ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Allreduce a list of tensors in one fused exchange; returns a list in the same order.

    Collective: every rank must call this, in the same order, with matching tensors.
    """
    communicator = comm.resolve(process_set)
    op = _resolve_op(average, op)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    packed = [compression.compress(t) for t in tensors]
    reduced = _grouped_allreduce_with_grad([p[0] for p in packed], op, prescale_factor,
                                           postscale_factor, name, communicator)
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, packed)]


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set: Any = None,
              ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` across ranks (default op: Average). ``tf.IndexedSlices`` are gathered.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_indexed_slices(tensor, _resolve_op(average, op), name, process_set)
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op,
                             prescale_factor, postscale_factor, name, process_set)[0]


def _allreduce_indexed_slices(slices: tf.IndexedSlices, op: ReduceOp, name: Optional[str],
                              process_set: Any) -> tf.IndexedSlices:
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise CollectiveArgumentError(
            f"allreduce of tf.IndexedSlices supports op=Sum or Average, got {op.name}; convert the "
            "gradient to a dense tensor (sparse_as_dense=True) to use other ops.")
    values = allgather(slices.values, name=None if name is None else f"{name}.values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=None if name is None else f"{name}.indices",
                        process_set=process_set)
    if op is ReduceOp.Average:
        values = values / tf.cast(comm.resolve(process_set).size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _host_allgather(tensor: tf.Tensor, name: Optional[str], communicator: comm.Communicator
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    def fn(array: np.ndarray) -> list[np.ndarray]:
        gathered, rows = comm.allgatherv(array, name, communicator)
        return [gathered, rows.astype(np.int64)]

    shape = tf.TensorShape([None]).concatenate(tensor.shape[1:])
    out, rows = host_call(fn, [tensor], [tensor.dtype, tf.int64], [shape, [communicator.size()]],
                          name="hpcrep_allgather")
    return out, rows


def allgather(tensor: Any, name: Optional[str] = None, process_set: Any = None,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank along the first dimension (which may differ).

    Collective: every rank must call this, in the same order.
    """
    communicator = comm.resolve(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise CollectiveArgumentError(
            "allgather needs a tensor with at least one dimension, got a scalar; "
            "use tf.reshape(t, [1]).")

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        y, rows = _host_allgather(x, name, communicator)

        def backward(dy: tf.Tensor):
            summed = _host_grouped_allreduce([dy], ReduceOp.Sum, 1.0, 1.0, _grad_name(name),
                                             communicator)[0]
            start = tf.reduce_sum(rows[:communicator.rank()])
            return summed[start:start + rows[communicator.rank()]]

        return y, backward

    return forward(tensor)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: Any = None, ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Allgather each tensor of a list (see :func:`allgather`).

    Collective: every rank must call this, in the same order.
    """
    return [allgather(t, None if name is None else f"{name}.{i}", process_set)
            for i, t in enumerate(tensors)]


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None, process_set: Any = None,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Return rank ``root_rank``'s value of ``tensor`` on every rank.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    communicator = comm.resolve(process_set)
    tensor = tf.convert_to_tensor(tensor)

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        y = host_call(lambda a: [comm.broadcast(a, root_rank, name, communicator)], [x],
                      [x.dtype], [x.shape], name="hpcrep_broadcast")[0]

        def backward(dy: tf.Tensor):
            summed = _host_grouped_allreduce([dy], ReduceOp.Sum, 1.0, 1.0, _grad_name(name),
                                             communicator)[0]
            return summed if comm.rank() == root_rank else tf.zeros_like(summed)

        return y, backward

    return forward(tensor)


def grouped_broadcast(tensors: Sequence[Any], root_rank: int,
                      name: Optional[str] = None, process_set: Any = None) -> list[tf.Tensor]:
    """Broadcast a list of tensors from ``root_rank`` in one fused exchange (no gradient).

    Collective: every rank must call this, in the same order, with matching tensors.
    """
    communicator = comm.resolve(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    return host_call(lambda *a: comm.grouped_broadcast(a, root_rank, name, communicator), tensors,
                     [t.dtype for t in tensors], [t.shape for t in tensors],
                     name="hpcrep_broadcast")


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None,
             ignore_name_scope: bool = False, process_set: Any = None
             ) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[j]`` rows to rank j; return ``(received, received_splits)``.

    Collective: every rank must call this, in the same order, with equal dtype and trailing shape.
    """
    communicator = comm.resolve(process_set)
    tensor = tf.convert_to_tensor(tensor)
    split_t = (tf.zeros([0], tf.int32) if splits is None
               else tf.cast(tf.convert_to_tensor(splits), tf.int32))
    has_splits = splits is not None

    def fn(a: np.ndarray, s: np.ndarray) -> list[np.ndarray]:
        out, received = comm.alltoall(a, s if has_splits else None, name, communicator)
        return [out, received.astype(np.int32)]

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        shape = tf.TensorShape([None]).concatenate(x.shape[1:])
        y, received = host_call(fn, [x, split_t], [x.dtype, tf.int32],
                                [shape, [communicator.size()]], name="hpcrep_alltoall")

        def backward(dy: tf.Tensor, _unused: Any = None):
            back = host_call(lambda d, s: [comm.alltoall(d, s, _grad_name(name), communicator)[0]],
                             [dy, received], [dy.dtype], [x.shape], name="hpcrep_alltoall")[0]
            return back

        return (y, received), backward

    y, received = forward(tensor)
    return y, received


def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = Compression.none,
                  op: Any = ReduceOp.Average, name: Optional[str] = None, process_set: Any = None,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` across ranks and return this rank's rows (first ranks get the extra rows).

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    communicator = comm.resolve(process_set)
    op = as_reduce_op(op)
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise CollectiveArgumentError(f"reducescatter supports op=Sum or Average, got {op.name}")
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        rows = None if x.shape.rank is None or x.shape[0] is None else x.shape[0]
        n, me = communicator.size(), communicator.rank()
        mine = None if rows is None else rows // n + (me < rows % n)
        shape = tf.TensorShape([mine]).concatenate(x.shape[1:])
        y = host_call(lambda a: [comm.reducescatter(a, op, prescale_factor, postscale_factor,
                                                    name, communicator)],
                      [x], [x.dtype], [shape], name="hpcrep_reducescatter")[0]

        def backward(dy: tf.Tensor):
            scale = prescale_factor * postscale_factor
            if op is ReduceOp.Average:
                scale /= n
            return (_host_allgather(dy, _grad_name(name), communicator)[0]
                    * tf.cast(scale, dy.dtype))

        return y, backward

    return compression.decompress(forward(compressed), ctx)


def grouped_reducescatter(tensors: Sequence[Any], op: Any = ReduceOp.Average,
                          name: Optional[str] = None, **kwargs: Any) -> list[tf.Tensor]:
    """Reducescatter each tensor of a list (see :func:`reducescatter`).

    Collective: every rank must call this, in the same order.
    """
    return [reducescatter(t, op=op, name=None if name is None else f"{name}.{i}", **kwargs)
            for i, t in enumerate(tensors)]

