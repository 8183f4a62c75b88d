"""Fused allreduce of many tensors: few exchanges, one copy in, zero-copy results.

Tensors are packed into fusion buckets (:func:`hpcrep.comm.fusion.plan`: one dtype per bucket,
at most ``HPCREP_FUSION_THRESHOLD`` bytes, 64-byte-aligned slots) planned once, at trace time;
each bucket is reduced as one buffer, and ``tf.split`` along rows of 64 bytes cuts it into the
results. TensorFlow shares the buffer for such aligned first-dimension splits, so they are
slices, not copies; a tensor whose element count is not a multiple of 64 bytes is copied once
more when its padding is cut off (odd-width biases: small).

Two paths reduce the buckets, chosen at trace time the same way on every rank
(:func:`hpcrep.tensorflow.native.handles`):

- **compiled** (:mod:`hpcrep.tensorflow.native`): per bucket, a stateful ``HpcrepAllreduceEnqueue``
  packs its tensors and queues the bucket on the communicator's communication thread, and an
  asynchronous ``HpcrepAllreduceWait`` yields the reduced buffer. Automatic control dependencies
  keep the enqueues in program order, so every rank queues the same buckets in the same order;
  a bucket's exchange starts as soon as its own tensors exist, while the rest of the step (the
  backward pass) still computes.
- **Python**: all buckets in one ``tf.numpy_function`` call, which hands the tensors over as numpy
  views (no copy); :func:`hpcrep.comm.collectives.allreduce_into_buckets` packs them into pooled
  aligned buffers with the same plan, and aligned numpy outputs become tensors without a copy.

Why the packing never happens with ``tf.concat``: TensorFlow assumes tensors are immutable, and
Grappler merges identical concats and folds constant ones into a ``Const`` that every call reuses,
so reducing a concat's output in place corrupts other results and later steps (regression test:
``tests/mpi/test_replicator.py::test_reducing_one_tensor_twice_in_a_tf_function``). Both paths
reduce buffers of their own.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.comm import check, fusion
from hpcrep.comm.collectives import allreduce_into_buckets
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveMismatchError, JoinError
from hpcrep.tensorflow import native
from hpcrep.tensorflow.bridge import host_call, require_no_xla
from hpcrep.tensorflow.errors import for_tensorflow


def can_fuse(tensors: Sequence[tf.Tensor]) -> bool:
    """Return True if the Python path's :func:`fused_allreduce` handles these tensors (static
    shapes, floating dtypes); the compiled path also takes integers and unknown shapes."""
    return all(t.shape.is_fully_defined() and t.dtype.is_floating for t in tensors)


def native_handles(tensors: Sequence[tf.Tensor], communicator: comm.Communicator) -> bool:
    """Return True if the compiled path reduces these tensors (decided alike on every rank)."""
    return all(native.handles(communicator, t.dtype.name) for t in tensors)


def fused_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
                    postscale: float, name: Optional[str],
                    communicator: Optional[comm.Communicator] = None) -> list[tf.Tensor]:
    """Allreduce tensors (any op); results in the same order, each bucket one exchange.

    Takes the compiled path when :func:`native_handles`, else the Python path, which needs
    :func:`can_fuse`. ``communicator`` (default :func:`hpcrep.comm.current`) is resolved now, at
    trace time.

    Collective: every rank of ``communicator`` must call this, in the same order, with matching
    tensors.
    """
    communicator = comm.resolve(communicator)
    if native_handles(tensors, communicator):
        return _native_allreduce(tensors, op, prescale, postscale, name, communicator)
    return _python_allreduce(tensors, op, prescale, postscale, name, communicator)


def _layout(tensors: Sequence[tf.Tensor]) -> tuple:
    return tuple((tuple(t.shape.as_list()), np.dtype(t.dtype.as_numpy_dtype).name)
                 for t in tensors)


def _python_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
                      postscale: float, name: Optional[str],
                      communicator: comm.Communicator) -> list[tf.Tensor]:
    buckets = fusion.plan(_layout(tensors), config.get("HPCREP_FUSION_THRESHOLD"))

    def reduce_on_host(*arrays: np.ndarray) -> list[np.ndarray]:
        return allreduce_into_buckets(arrays, buckets, op, prescale, postscale, name,
                                      communicator)

    reduced = host_call(reduce_on_host, tensors,
                        [tf.as_dtype(b.dtype) for b in buckets],
                        [tf.TensorShape([b.length]) for b in buckets], name="hpcrep_allreduce")
    out: list = [None] * len(tensors)
    for bucket, flat in zip(buckets, reduced):
        _split_static(bucket, flat, tensors, out)
    return out


def _split_static(bucket: fusion.Bucket, flat: tf.Tensor, tensors: Sequence[tf.Tensor],
                  out: list) -> None:
    """Cut a reduced bucket into its tensors (views along aligned rows)."""
    per = max(1, fusion.ALIGN // bucket.dtype.itemsize)
    rows = tf.reshape(flat, [-1, per])
    sizes = [fusion.padded_count(s.count, bucket.dtype.itemsize) // per for s in bucket.slots]
    pieces = [rows] if len(sizes) == 1 else tf.split(rows, sizes, axis=0)
    for slot, piece in zip(bucket.slots, pieces):
        if piece.shape[0] * per != slot.count:
            piece = tf.reshape(piece, [-1])[:slot.count]
        out[slot.index] = tf.reshape(piece, tensors[slot.index].shape)


def _describe(tensors: Sequence[tf.Tensor], indices: Sequence[int], op: ReduceOp,
              name: Optional[str]) -> str:
    """Return how a mismatch message shows one bucket: op, names, dtypes and traced shapes."""
    def shape(t: tf.Tensor) -> str:
        if t.shape.rank is None:
            return "?"
        return ", ".join("?" if d is None else str(d) for d in t.shape.as_list())

    label = name or "allreduce"
    shown = [f"'{label}.{i}' {tensors[i].dtype.name}[{shape(tensors[i])}]" for i in indices[:3]]
    more = f" and {len(indices) - 3} more" if len(indices) > 3 else ""
    return f"allreduce({op.name}) of {', '.join(shown)}{more}"


def _wait(handle: tf.Tensor, dtype: tf.DType, length: int) -> tf.Tensor:
    """Return the reduced buffer; eagerly, hpcrep's errors arrive as their own types."""
    try:
        return native.ops().hpcrep_allreduce_wait(handle, T=dtype, length=length,
                                                  name="hpcrep_allreduce_wait")
    except tf.errors.FailedPreconditionError as error:
        for prefix, kind in ((native.MISMATCH, CollectiveMismatchError),
                             (native.JOIN_ERROR, JoinError)):
            at = error.message.find(prefix)
            if at >= 0:
                raise for_tensorflow(kind(error.message[at + len(prefix):])) from None
        raise


def _native_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
                      postscale: float, name: Optional[str],
                      communicator: comm.Communicator) -> list[tf.Tensor]:
    require_no_xla("hpcrep_allreduce")
    engine = native.engine(communicator)
    ops = native.ops()
    static = all(t.shape.is_fully_defined() for t in tensors)
    if static:
        buckets = fusion.plan(_layout(tensors), config.get("HPCREP_FUSION_THRESHOLD"))
        groups = [[s.index for s in b.slots] for b in buckets]
    else:  # sizes known only when the step runs: one bucket per dtype
        by_dtype: dict[str, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype.name, []).append(i)
        groups = sorted(by_dtype.values())
        buckets = [None] * len(groups)
    out: list = [None] * len(tensors)
    params = (op.name, float(prescale), float(postscale), False)
    for bucket, group in zip(buckets, groups):
        members = [tensors[i] for i in group]
        signature = (
            "allreduce", params,
            tuple((f"{i}", t.dtype.name, tuple(t.shape.as_list()) if t.shape.rank is not None
                   else ("?",)) for i, t in zip(group, members)))
        handle = ops.hpcrep_allreduce_enqueue(
            members, engine=engine, reduce_op=native.REDUCE_KINDS[op.name],
            prescale_bits=native.bits(prescale), postscale_bits=native.bits(postscale),
            signature=check.signature_hash(signature),
            description=_describe(tensors, group, op, name),
            chunk_bytes=int(config.get("HPCREP_ALLREDUCE_CHUNK")), name="hpcrep_allreduce_enqueue")
        flat = _wait(handle, members[0].dtype, -1 if bucket is None else bucket.length)
        if bucket is not None:
            _split_static(bucket, flat, tensors, out)
        else:
            _split_dynamic(flat, group, tensors, out)
    return out


def _split_dynamic(flat: tf.Tensor, group: Sequence[int], tensors: Sequence[tf.Tensor],
                   out: list) -> None:
    """Cut a reduced bucket whose tensors' sizes are known only at run time."""
    itemsize = tensors[group[0]].dtype.size
    per = max(1, fusion.ALIGN // itemsize)
    counts = [tf.size(tensors[i], out_type=tf.int64) for i in group]
    padded = [(c + per - 1) // per * per for c in counts]
    for i, c, piece in zip(group, counts, tf.split(flat, tf.stack(padded), num=len(group))):
        out[i] = tf.reshape(piece[:c], tf.shape(tensors[i]))
