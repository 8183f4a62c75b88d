"""Fused allreduce of many floating tensors with one host round trip and one copy.

``tf.numpy_function`` costs about 23 us per tensor it carries (ResNet-50's 214 gradients: ~5 ms),
so the tensors are fused on the TensorFlow side instead: ``tf.concat`` packs each fusion bucket
(plan from :func:`hpcrep.comm.fusion.plan`, slots padded to 64 bytes) into a fresh buffer, the host
call carries one tensor per bucket and MPI reduces it in place, and ``tf.split`` along rows of 64
bytes hands the results back as slices of the reduced buffer. TensorFlow shares the buffer for
splits along the first dimension whose pieces stay 64-byte aligned, so the only full copy is the
concat; tensors whose element count is not a multiple of 64 bytes are copied once more when their
padding is cut off (biases of odd width: small).

Average is a Sum followed by one in-place scale of the buffer (1/size). Tensors with unknown
static shapes or non-floating dtypes take the numpy path of :func:`hpcrep.comm.grouped_allreduce`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.comm import check, fusion
from hpcrep.comm.ops import ReduceOp
from hpcrep.tensorflow.bridge import host_call


def _numpy_dtype(dtype: tf.DType) -> np.dtype:
    return np.dtype(dtype.as_numpy_dtype)


def can_fuse(tensors: Sequence[tf.Tensor]) -> bool:
    """Return True if :func:`fused_allreduce` handles these tensors (static shapes, floats)."""
    return all(t.shape.is_fully_defined() and t.dtype.is_floating for t in tensors)


def fused_allreduce(tensors: Sequence[tf.Tensor], op: ReduceOp, prescale: float,
                    postscale: float, name: Optional[str]) -> list[tf.Tensor]:
    """Allreduce floating tensors with static shapes (Sum, Average, Min, Max, Product).

    Collective: every rank must call this, in the same order, with matching tensors.
    """
    shapes = [tuple(t.shape.as_list()) for t in tensors]
    dtypes = [_numpy_dtype(t.dtype) for t in tensors]
    layout = tuple((s, d.name) for s, d in zip(shapes, dtypes))
    names = ([f"allreduce.{i}" for i in range(len(tensors))] if name is None else
             [name] if len(tensors) == 1 else [f"{name}.{i}" for i in range(len(tensors))])
    entries = tuple((nm, d.name, s) for nm, d, s in zip(names, dtypes, shapes))
    signature = ("allreduce", (op.name, prescale, postscale), entries)
    scale = prescale * postscale / (comm.size() if op is ReduceOp.Average else 1)
    mpi_op = ReduceOp.Sum if op is ReduceOp.Average else op
    buckets = fusion.plan(layout, config.get("HPCREP_FUSION_THRESHOLD"))

    packed, owned = [], []
    for bucket in buckets:
        pieces = []
        for slot in bucket.slots:
            pieces.append(tf.reshape(tensors[slot.index], [-1]))
            pad = fusion.padded_count(slot.count, bucket.dtype.itemsize) - slot.count
            if pad:
                pieces.append(tf.zeros([pad], tensors[slot.index].dtype))
        # Never reduce a buffer TensorFlow may share: one piece is the caller's own tensor, and in
        # a tf.function Grappler merges identical concats (two allreduces of one tensor) and
        # folds constant ones into a Const reused by every call, so in-place results leak into
        # other reductions and later steps. Copy every bucket into the pool first.
        owned.append(False)
        packed.append(tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0])

    def reduce_on_host(*buffers: np.ndarray) -> list[np.ndarray]:
        mine = [b if own else fusion.copy_to_pool(b) for b, own in zip(buffers, owned)]
        return comm.allreduce_buckets_inplace(mine, mpi_op, signature, scale)

    reduced = host_call(reduce_on_host, packed, [p.dtype for p in packed],
                        [p.shape for p in packed], name="hpcrep_allreduce")
    out: list = [None] * len(tensors)
    for bucket, flat in zip(buckets, reduced):
        per = max(1, fusion.ALIGN // bucket.dtype.itemsize)
        rows = tf.reshape(flat, [-1, per])
        sizes = [fusion.padded_count(s.count, bucket.dtype.itemsize) // per for s in bucket.slots]
        for slot, piece in zip(bucket.slots, tf.split(rows, sizes, axis=0)):
            piece = tf.reshape(piece, [-1])
            if piece.shape[0] != slot.count:
                piece = piece[:slot.count]
            out[slot.index] = tf.reshape(piece, shapes[slot.index])
    return out
