"""Collectives on TensorFlow tensors, with gradients, eagerly and inside ``tf.function``.

Each function has the name, arguments and semantics of its ``horovod.tensorflow`` counterpart and
is collective: every rank must call it, in the same order, with tensors of the same dtype and
shape (allgather and alltoall: all but the first dimension). Mismatches raise on every rank.

Each runs on ``process_set`` (a :class:`hpcrep.comm.ProcessSet`, a
:class:`hpcrep.comm.Communicator` or None for :func:`hpcrep.comm.current`), resolved when the op
is built (at trace time inside ``tf.function``) and handed to the host callback (the Python path,
which TensorFlow runs on a thread of its own) or to the compiled path's communication thread.


Gradients follow Horovod's (``horovod/tensorflow/mpi_ops.py``): allreduce's is the same
allreduce (op and scale factors) of the upstream gradient; allgather's is this rank's rows of the
*averaged* upstream gradient; broadcast's is the averaged gradient on the root and zero elsewhere;
alltoall's sends gradients back along the received splits; reducescatter's is the allgathered
gradient, times ``size`` for ``op=Sum``. One deliberate exception: Horovod differentiates Min, Max
and Product as if they were the op itself (an allreduce-Max of the gradient); hpcrep routes the
summed gradient to the ranks that held the extreme (Min/Max) and uses the product rule (Product),
which are the derivatives of those reductions.

Scale factors on float16/bfloat16 are applied in float32 and rounded once per factor, as
Horovod's CPU ops do; summation stays in the tensor's dtype.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm import adasum
from hpcrep.comm.collectives import check_scale_factors
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import CollectiveArgumentError, CollectiveUnsupportedError
from hpcrep.tensorflow import fused
from hpcrep.tensorflow.bridge import host_call, require_no_xla
from hpcrep.tensorflow.compressors import Compressor, NoneCompressor


def _resolve_op(average: Optional[bool], op: Any) -> ReduceOp:
    if average is not None and op is not None:
        raise CollectiveArgumentError(
            "pass either average= (deprecated) or op=, not both; use op=hvd.Average or op=hvd.Sum")
    if op is None:
        return ReduceOp.Average if average is None or average else ReduceOp.Sum
    return as_reduce_op(op)


_LOW_PRECISION = (tf.float16, tf.bfloat16)


def _scale(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """Return ``tensor * factor``: float16/bfloat16 in float32, integers in float64 (Horovod's)."""
    if factor == 1.0:
        return tensor
    if tensor.dtype in _LOW_PRECISION:
        return tf.cast(tf.cast(tensor, tf.float32) * factor, tensor.dtype)
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _allreduce_dense(tensors: Sequence[tf.Tensor], op: ReduceOp, pre: float, post: float,
                     name: Optional[str], communicator: comm.Communicator) -> list[tf.Tensor]:
    """Allreduce dense tensors (no gradient) on the path :func:`fused.choose_allreduce_path`
    picks: compiled, fused on the host, or one host call.

    Collective: every rank of ``communicator`` must call this, in the same order, with matching
    tensors.
    """
    check_scale_factors(op, pre, post)
    if op is ReduceOp.Adasum:
        return _adasum_dense(tensors, pre, post, name, communicator)
    low = [i for i, t in enumerate(tensors) if t.dtype in _LOW_PRECISION]
    if low and (pre != 1.0 or post != 1.0):
        return _allreduce_low_precision_scaled(tensors, low, op, pre, post, name, communicator)
    path = fused.choose_allreduce_path(tensors, pre, post, communicator)
    if path is fused.AllreducePath.IDENTITY:
        require_no_xla("hpcrep_allreduce")
        return [tf.identity(t) if pre * post == 1.0 else _scale(t, pre * post) for t in tensors]
    if path is not fused.AllreducePath.HOST:
        return fused.fused_allreduce(path, tensors, op, pre, post, name, communicator)

    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        return comm.grouped_allreduce(arrays, op, pre, post, name, communicator)

    return host_call(fn, tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
                     name="hpcrep_allreduce")


def _adasum_dense(tensors: Sequence[tf.Tensor], pre: float, post: float, name: Optional[str],
                  communicator: comm.Communicator) -> list[tf.Tensor]:
    """Adasum of dense float tensors (:mod:`hpcrep.comm.adasum`) on the Python path: the
    compiled op has no Adasum. Scale factors are applied here, float16 in float32 as Horovod
    does (Adasum is scale-equivariant, so where they apply changes only rounding).

    Collective: every rank of ``communicator`` must call this, in the same order, with matching
    tensors.

    Raises:
        CollectiveUnsupportedError: a dtype other than float16/32/64, or a number of ranks that is
            not a power of two (checked at every size, before anything is sent).
    """
    adasum.check([t.dtype.name for t in tensors], communicator.size())
    tensors = [_scale(t, pre) for t in tensors]
    path = fused.choose_allreduce_path(tensors, 1.0, 1.0, communicator)
    if path is fused.AllreducePath.IDENTITY:
        require_no_xla("hpcrep_allreduce")
        reduced = [tf.identity(t) for t in tensors]
    elif all(t.shape.is_fully_defined() for t in tensors):
        reduced = fused.fused_allreduce(fused.AllreducePath.FUSED_HOST, tensors, ReduceOp.Adasum,
                                        1.0, 1.0, name, communicator)
    else:
        reduced = host_call(
            lambda *a: comm.grouped_allreduce(a, ReduceOp.Adasum, 1.0, 1.0, name, communicator),
            tensors, [t.dtype for t in tensors], [t.shape for t in tensors],
            name="hpcrep_allreduce")
    return [_scale(t, post) for t in reduced]


def _allreduce_low_precision_scaled(tensors: Sequence[tf.Tensor], low: list[int], op: ReduceOp,
                                    pre: float, post: float, name: Optional[str],
                                    communicator: comm.Communicator) -> list[tf.Tensor]:
    """Reduce with scale factors, scaling float16/bfloat16 in float32 as Horovod does.

    Those tensors are pre-scaled here, summed on the host, then post-scaled by ``post`` (Average:
    ``post / size``); the other tensors go through the host with the factors as usual. Two
    exchanges, in the same order on every rank.
    """
    out: list = [None] * len(tensors)
    rest = [i for i in range(len(tensors)) if i not in low]
    if rest:
        for i, y in zip(rest, _allreduce_dense([tensors[i] for i in rest], op, pre, post,
                                                      name, communicator)):
            out[i] = y
    after = post / communicator.size() if op is ReduceOp.Average else post
    summed = _allreduce_dense([_scale(tensors[i], pre) for i in low], ReduceOp.Sum, 1.0,
                                     1.0, None if name is None else f"{name}.low", communicator)
    for i, y in zip(low, summed):
        out[i] = _scale(y, after)
    return out


def _grouped_allreduce_with_grad(tensors: Sequence[tf.Tensor], op: ReduceOp, pre: float,
                                 post: float, name: Optional[str],
                                 communicator: comm.Communicator) -> list[tf.Tensor]:
    @tf.custom_gradient
    def forward(*xs: tf.Tensor):
        ys = _allreduce_dense(xs, op, pre, post, name, communicator)

        def backward(*dys: tf.Tensor):
            dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(ys, dys)]
            if op in (ReduceOp.Sum, ReduceOp.Average, ReduceOp.Adasum):  # Horovod's, for Adasum
                return _allreduce_dense(dys, op, pre, post, _grad_name(name), communicator)
            summed = _allreduce_dense(dys, ReduceOp.Sum, 1.0, 1.0, _grad_name(name),
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
                      compression: type[Compressor] = NoneCompressor, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, process_set: Any = None,
                      ignore_name_scope: bool = False) -> list[Any]:
    """Allreduce a list of tensors and ``tf.IndexedSlices``; returns a list in the same order.

    Dense tensors are reduced in one fused exchange. ``tf.IndexedSlices`` are allgathered
    (values and indices; Average divides the values by ``size``), as in Horovod; they support
    only Sum and Average without scale factors (``NotImplementedError`` otherwise).
    ``op=Adasum`` (:mod:`hpcrep.comm.adasum`) takes float16/32/64 tensors on a power-of-two
    number of ranks of the whole job, as Horovod's; its gradient is the Adasum of the upstream
    gradients (Horovod's).

    Collective: every rank must call this, in the same order, with matching tensors.

    Raises:
        CollectiveUnsupportedError: ``tf.IndexedSlices`` with another op or with scale factors;
            Adasum with another dtype, rank count or a process set.
        CollectiveArgumentError: both ``average`` and ``op``, or scale factors with Min/Max/Product.
    """
    op = _resolve_op(average, op)
    if op is ReduceOp.Adasum:
        require_global_for_adasum(process_set)
    communicator = comm.resolve(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    out: list = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(op, prescale_factor, postscale_factor)
        for i, reduced in zip(sparse, _allreduce_indexed_slices([tensors[i] for i in sparse], op,
                                                                name, communicator)):
            out[i] = reduced
    dense = [i for i in range(len(tensors)) if out[i] is None]
    if dense:
        packed = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = _grouped_allreduce_with_grad([p[0] for p in packed], op, prescale_factor,
                                               postscale_factor, name, communicator)
        for i, r, p in zip(dense, reduced, packed):
            out[i] = compression.decompress(r, p[1])
    return out


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = NoneCompressor,
              op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set: Any = None,
              ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` across ranks (default op: Average). ``tf.IndexedSlices`` are gathered.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op,
                             prescale_factor, postscale_factor, name, process_set)[0]


def require_global_for_adasum(process_set: Any) -> None:
    """Raise :class:`CollectiveUnsupportedError` if ``process_set`` is a process set other than
    the whole job: Horovod's Adasum "does not support non-global process sets yet". Local."""
    if isinstance(process_set, comm.ProcessSet) and process_set.process_set_id != 0:
        raise CollectiveUnsupportedError(
            "Adasum does not support non-global process sets yet (as in Horovod); reduce over "
            "the whole job or use op=Average/Sum on the process set.")


def _check_sparse(op: ReduceOp, pre: float, post: float) -> None:
    if op is ReduceOp.Adasum:
        raise CollectiveUnsupportedError(
            "The Adasum reduction does not currently support sparse tensors (tf.IndexedSlices), "
            "as in Horovod; pass sparse_as_dense=True to DistributedOptimizer or "
            "DistributedGradientTape, or convert the gradient with tf.convert_to_tensor.")
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise CollectiveUnsupportedError(
            f"allreduce of tf.IndexedSlices supports op=Sum or Average, got {op.name}; convert the "
            "gradient to a dense tensor (sparse_as_dense=True, or tf.convert_to_tensor) to use "
            "other ops.")
    if pre != 1.0 or post != 1.0:
        raise CollectiveUnsupportedError(
            f"prescale_factor/postscale_factor are not supported with tf.IndexedSlices (got "
            f"{pre}, {post}); scale the slices' values yourself or convert them to a dense tensor.")


def _allreduce_indexed_slices(slices: Sequence[tf.IndexedSlices], op: ReduceOp,
                              name: Optional[str], communicator: comm.Communicator
                              ) -> list[tf.IndexedSlices]:
    prefix = "sparse" if name is None else name
    values = grouped_allgather([s.values for s in slices], name=f"{prefix}.values",
                               process_set=communicator)
    indices = grouped_allgather([s.indices for s in slices], name=f"{prefix}.indices",
                                process_set=communicator)
    if op is ReduceOp.Average:
        values = [v / tf.cast(communicator.size(), v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape)
            for v, i, s in zip(values, indices, slices)]


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

    Gradient (Horovod's): this rank's rows of the upstream gradient averaged across ranks.

    Collective: every rank must call this, in the same order.
    """
    return gather_rows(tensor, name, ReduceOp.Average, process_set)


def gather_rows(tensor: Any, name: Optional[str] = None,
                gradient_reduction: ReduceOp = ReduceOp.Average,
                process_set: Any = None) -> tf.Tensor:
    """:func:`allgather`, with the reduction its gradient applies to the upstream gradient.

    Horovod averages (``ReduceOp.Average``); ``tf.distribute``'s ``all_gather``, which
    :mod:`hpcrep.replicator` follows, sums (``ReduceOp.Sum``).

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
            reduced = _allreduce_dense([dy], gradient_reduction, 1.0, 1.0,
                                              _grad_name(name), communicator)[0]
            start = tf.reduce_sum(rows[:communicator.rank()])
            return reduced[start:start + rows[communicator.rank()]]

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

    Gradient (Horovod's): the upstream gradient averaged across ranks on the root, zero elsewhere.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return broadcast_from(tensor, root_rank, name, ReduceOp.Average, process_set)


def broadcast_from(tensor: Any, root_rank: int, name: Optional[str] = None,
                   gradient_reduction: ReduceOp = ReduceOp.Average,
                   process_set: Any = None) -> tf.Tensor:
    """:func:`broadcast`, with the reduction its gradient applies (Horovod: Average).

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    communicator = comm.resolve(process_set)
    tensor = tf.convert_to_tensor(tensor)

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        y = host_call(lambda a: [comm.broadcast(a, root_rank, name, communicator)], [x],
                      [x.dtype], [x.shape], name="hpcrep_broadcast")[0]

        def backward(dy: tf.Tensor):
            reduced = _allreduce_dense([dy], gradient_reduction, 1.0, 1.0,
                                              _grad_name(name), communicator)[0]
            if comm.rank() == root_rank:
                return reduced
            # Zeros that still wait for the allreduce: a plain zeros_like of a static shape
            # does not, and a Session would skip this rank's allreduce while the root waits.
            with tf.control_dependencies([reduced]):
                return tf.zeros_like(reduced)

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
             ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Send ``splits[j]`` rows to rank j (default: equal parts) and gather what arrives.

    As in Horovod, returns the received tensor alone when ``splits`` is None, and
    ``(received, received_splits)`` (int32, one entry per rank) when ``splits`` is given.

    Collective: every rank must call this, in the same order, with equal dtype and trailing shape.

    Raises:
        TFCollectiveArgumentError: bad ``splits`` (also a ``tf.errors.InvalidArgumentError``).
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
    return (y, received) if has_splits else y


def reducescatter(tensor: Any, device_dense: str = "",
                  compression: type[Compressor] = NoneCompressor, op: Any = ReduceOp.Average,
                  name: Optional[str] = None, process_set: Any = None,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` across ranks and return this rank's rows (first ranks get the extra rows).

    A scalar (0-d) tensor is an error on every rank (``tf.errors.InvalidArgumentError``), as in
    Horovod: there are no rows to scatter.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return grouped_reducescatter([tensor], device_dense, compression, op, process_set,
                                 prescale_factor, postscale_factor, name=name)[0]


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = NoneCompressor,
                          op: Any = ReduceOp.Average, process_set: Any = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None,
                          ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Reducescatter each tensor of a list (see :func:`reducescatter`) in one operation.

    The group is one host call (and one op in a graph), as Horovod's grouped op is one request:
    in a TF1 graph, separate ops for each tensor have no order between them, and ranks running
    them in different orders reduced one rank's tensor with another's.

    Collective: every rank must call this, in the same order, with matching tensors.
    """
    communicator = comm.resolve(process_set)
    op = as_reduce_op(op)
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise CollectiveArgumentError(f"reducescatter supports op=Sum or Average, got {op.name}")
    if not tensors:
        return []
    packed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    reduced = _reducescatter_with_grad([p[0] for p in packed], op, prescale_factor,
                                       postscale_factor, name, communicator)
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, packed)]


def _scattered_shape(shape: tf.TensorShape, n: int, me: int) -> Optional[tf.TensorShape]:
    """This rank's share of ``shape`` (the first ``rows % n`` ranks get one extra row)."""
    if shape.rank in (None, 0):
        return None
    rows = shape[0]
    mine = None if rows is None else rows // n + (me < rows % n)
    return tf.TensorShape([mine]).concatenate(shape[1:])


def _reducescatter_with_grad(tensors: Sequence[tf.Tensor], op: ReduceOp, pre: float,
                             post: float, name: Optional[str],
                             communicator: comm.Communicator) -> list[tf.Tensor]:
    """Reducescatter ``tensors`` in one host call, with Horovod's gradient.

    float16/bfloat16 tensors with scale factors are scaled in float32 here and summed on the
    host (Horovod's CPU arithmetic); the others are scaled on the host. Both groups go in the
    same call, in a fixed order. Collective: every rank of ``communicator`` must call this, in
    the same order, with matching tensors.
    """
    n, me = communicator.size(), communicator.rank()
    scaled = pre != 1.0 or post != 1.0
    low = [i for i, t in enumerate(tensors) if scaled and t.dtype in _LOW_PRECISION]
    rest = [i for i in range(len(tensors)) if i not in low]
    low_name = None if name is None else f"{name}.low"

    @tf.custom_gradient
    def forward(*xs: tf.Tensor):
        inputs = [_scale(x, pre) if i in low else x for i, x in enumerate(xs)]

        def fn(*arrays: np.ndarray) -> list[np.ndarray]:
            out: list = [None] * len(arrays)
            if rest:
                for i, y in zip(rest, comm.grouped_reducescatter(
                        [arrays[i] for i in rest], op, pre, post, name, communicator)):
                    out[i] = y
            if low:
                for i, y in zip(low, comm.grouped_reducescatter(
                        [arrays[i] for i in low], ReduceOp.Sum, 1.0, 1.0, low_name,
                        communicator)):
                    out[i] = y
            return out

        ys = host_call(fn, inputs, [x.dtype for x in xs],
                       [_scattered_shape(x.shape, n, me) for x in xs],
                       name="hpcrep_reducescatter")
        after = post / n if op is ReduceOp.Average else post
        ys = [_scale(y, after) if i in low else y for i, y in enumerate(ys)]

        def backward(*dys: tf.Tensor):
            # Horovod: allgather each gradient, times size for Sum (scale factors ignored). One
            # gather per tensor, as Horovod's gradient: tf.gradients(ys[i], xs[i]) then runs only
            # the i-th. In a TF1 graph nothing else orders them after the forward op (they need
            # no forward value), so ranks could run the two in different orders.
            dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(ys, dys)]
            with tf.control_dependencies(ys):
                dys = [tf.identity(dy) for dy in dys]
            gathered = [_host_grouped_allgather([dy], _grad_name(name), communicator)[0]
                        for dy in dys]
            return [g * tf.cast(n, g.dtype) if op is ReduceOp.Sum else g for g in gathered]

        return ys, backward

    return list(forward(*tensors))


def _host_grouped_allgather(tensors: Sequence[tf.Tensor], name: Optional[str],
                            communicator: comm.Communicator) -> list[tf.Tensor]:
    """Allgather ``tensors`` in one host call (no gradient). Collective, as allgather."""
    def fn(*arrays: np.ndarray) -> list[np.ndarray]:
        return comm.grouped_allgather(arrays, name, communicator)

    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else None
              for t in tensors]
    return host_call(fn, tensors, [t.dtype for t in tensors], shapes,
                     name="hpcrep_allgather")
