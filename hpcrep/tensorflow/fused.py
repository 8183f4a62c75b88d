"""Fused allreduce of many tensors: few exchanges, one copy in, zero-copy results.

Tensors are packed into fusion buckets (:func:`hpcrep.comm.fusion.plan`: one dtype per bucket,
at most ``HPCREP_FUSION_THRESHOLD`` bytes, 64-byte-aligned slots) planned once, at trace time;
each bucket is reduced as one buffer, and ``tf.split`` along rows of 64 bytes cuts it into the
results. TensorFlow shares the buffer for such aligned first-dimension splits, so they are
slices, not copies; a tensor whose element count is not a multiple of 64 bytes is copied once
more when its padding is cut off (odd-width biases: small).

:func:`choose_allreduce_path` decides, at trace time and the same way on every rank, which path
reduces a group of tensors; two of them reduce fusion buckets:

- **compiled** (:mod:`hpcrep.tensorflow.native`): per bucket, a stateful ``HpcrepAllreduceStart``
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

import enum
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.comm import check, fusion
from hpcrep.comm.collectives import allreduce_into_buckets, hierarchical
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveMismatchError, JoinError
from hpcrep.tensorflow import autotune, native
from hpcrep.tensorflow.bridge import host_call, require_no_xla
from hpcrep.tensorflow.errors import for_tensorflow


class AllreducePath(enum.Enum):
    """How a group of dense tensors is allreduced (see :func:`choose_allreduce_path`)."""

    IDENTITY = "identity"      # one rank: every reduction is the identity (scaled), no exchange
    COMPILED = "compiled"      # the compiled op: buckets queued on the communication thread
    FUSED_HOST = "fused host"  # one host call reducing fusion buckets (static floating tensors)
    HOST = "host"              # one host call to hpcrep.comm.grouped_allreduce (anything else)


def choose_allreduce_path(tensors: Sequence[tf.Tensor], prescale: float, postscale: float,
                          communicator: comm.Communicator) -> AllreducePath:
    """Return the path that allreduces ``tensors`` on ``communicator``: the one place it is
    decided.

    The answer depends only on the tensors' traced dtypes and shapes and on settings that are
    equal on every rank (``HPCREP_NATIVE``, ``HPCREP_HIERARCHICAL_ALLREDUCE``, the communicator's
    size and nodes), never on the data, so every rank takes the same path. The compiled op takes
    dense numeric tensors of :data:`hpcrep.tensorflow.native.DTYPES` of any shape on a flat
    communicator; hierarchical allreduces and other dtypes take the host. Local.
    """
    if communicator.size() == 1 and (prescale * postscale == 1.0
                                     or all(t.dtype.is_floating for t in tensors)):
        return AllreducePath.IDENTITY
    if (all(t.dtype.name in native.DTYPES for t in tensors) and native.active()
            and not hierarchical(communicator)):
        return AllreducePath.COMPILED
    if all(t.shape.is_fully_defined() and t.dtype.is_floating for t in tensors):
        return AllreducePath.FUSED_HOST
    return AllreducePath.HOST


def fused_allreduce(path: AllreducePath, tensors: Sequence[tf.Tensor], op: ReduceOp,
                    prescale: float, postscale: float, name: Optional[str],
                    communicator: comm.Communicator) -> list[tf.Tensor]:
    """Allreduce tensors (any op) on ``path`` (:data:`AllreducePath.COMPILED` or
    :data:`AllreducePath.FUSED_HOST`); results in the same order, each bucket one exchange.

    Collective: every rank of ``communicator`` must call this, in the same order, with matching
    tensors (and so the same path).
    """
    if path is AllreducePath.COMPILED:
        return _compiled_allreduce(tensors, op, prescale, postscale, name, communicator)
    if path is AllreducePath.FUSED_HOST:
        return _host_fused_allreduce(tensors, op, prescale, postscale, name, communicator)
    raise ValueError(f"fused_allreduce takes the compiled or fused host path, not {path.name}")


def _layout(tensors: Sequence[tf.Tensor]) -> tuple:
    return tuple((tuple(t.shape.as_list()), np.dtype(t.dtype.as_numpy_dtype).name)
                 for t in tensors)


def _host_fused_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
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


_ERRORS = {native.ErrorKind.MISMATCH: CollectiveMismatchError, native.ErrorKind.JOIN: JoinError}


def _wait(handle: tf.Tensor, dtype: tf.DType, length: int) -> tf.Tensor:
    """Return the reduced buffer; eagerly, hpcrep's errors arrive as their own types (chosen by
    the code the engine attached to the error, never by its text)."""
    try:
        return native.ops().hpcrep_allreduce_wait(handle, T=dtype, length=length,
                                                  name="hpcrep_allreduce_wait")
    except tf.errors.OpError as error:
        kind = _error_kind(error)
        if kind in _ERRORS:
            raise for_tensorflow(_ERRORS[kind](error.message)) from None
        raise


def _error_kind(error: tf.errors.OpError) -> Optional[native.ErrorKind]:
    """Return the engine's code attached to ``error`` (its payload), or None if it has none."""
    payloads = error.experimental_payloads or {}  # eagerly: bytes keys and values
    payload = payloads.get(native.PAYLOAD_KEY.encode(), payloads.get(native.PAYLOAD_KEY))
    if payload is None:
        return None
    try:
        return native.ErrorKind(int(payload))
    except ValueError:
        return None


def _compiled_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
                      postscale: float, name: Optional[str],
                      communicator: comm.Communicator) -> list[tf.Tensor]:
    require_no_xla("hpcrep_allreduce")
    engine = native.engine(communicator)
    ops = native.ops()
    static = all(t.shape.is_fully_defined() for t in tensors)
    # Tuned (the gradient exchange under HPCREP_AUTOTUNE): the engine fuses the buckets up to the
    # tuned threshold and cuts them into the tuned pieces when they are queued.
    tuned = autotune.in_tuned_scope()
    threshold = int(config.get("HPCREP_FUSION_THRESHOLD"))
    if static:
        buckets = fusion.plan(_layout(tensors), threshold)
        groups = [[s.index for s in b.slots] for b in buckets]
    else:  # sizes known only when the step runs: one bucket per dtype
        by_dtype: dict[str, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype.name, []).append(i)
        groups = sorted(by_dtype.values())
        buckets = [None] * len(groups)
    out: list = [None] * len(tensors)
    params = (op.name, float(prescale), float(postscale))
    for index, (bucket, group) in enumerate(zip(buckets, groups)):
        members = [tensors[i] for i in group]
        signature = (
            "allreduce", params,
            tuple((f"{i}", t.dtype.name, tuple(t.shape.as_list()) if t.shape.rank is not None
                   else ("?",)) for i, t in zip(group, members)))
        handle = ops.hpcrep_allreduce_start(
            members, engine=engine, reduce_op=int(op),
            prescale_bits=native.bits(prescale), postscale_bits=native.bits(postscale),
            signature=check.signature_hash(signature),
            description=_describe(tensors, group, op, name),
            chunk_bytes=int(config.get("HPCREP_ALLREDUCE_CHUNK")), fusion_bytes=threshold,
            tuned=tuned,
            match_name=f"{name}.{index}" if name else "", name="hpcrep_allreduce_start")
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
