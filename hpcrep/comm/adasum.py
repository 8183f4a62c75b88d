"""Adasum: adaptive summation of arrays across ranks (Maleki et al., "Scaling Distributed
Training with Adaptive Summation", MLSys 2021), with Horovod's semantics.

Two ranks' values ``a`` and ``b`` of one tensor combine as::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is ``a + b`` for orthogonal ``a`` and ``b`` and their average for parallel ones. The dot
product and squared norms are taken per tensor (never across the tensors of a fused buffer) in
float64, and a norm below ``sqrt(DBL_MIN)`` leaves its coefficient at 1, as in Horovod
(``horovod/common/ops/adasum/adasum.h``). ``N`` ranks (a power of two) combine in a binary tree:
ranks ``2i`` and ``2i+1`` first, then pairs of pairs, and so on, the lower group's value always
``a``; this is the order of Horovod's reference (``test/parallel/test_adasum_tensorflow.py``).

How: recursive doubling. At level ``L = 1, 2, 4, ...`` each rank swaps its whole current buffer
with rank ``rank ^ L`` (``MPI_Sendrecv``) and both compute ``adasum(lower, upper)`` with the same
arithmetic, so every rank ends with the same bits and no broadcast is needed. Cost: ``log2 N``
exchanges of the full buffer per rank (``N log2 N`` buffers moved in all) and ``log2 N`` passes
of float64 arithmetic, against about two buffers per rank for Horovod's vector-halving,
distance-doubling scheme, which splits each level's work across the pair; correctness and
bitwise agreement first. Dot products use numpy's pairwise summation (not BLAS, whose threading
could change the bits from rank to rank).

Supported as in Horovod's MPI Adasum: float16, float32 and float64 arrays, a power-of-two number
of ranks. float16 is combined in float64 and rounded once (Horovod's AVX kernel works in float32).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from hpcrep.comm.fusion import Bucket
from hpcrep.errors import CollectiveUnsupportedError

DTYPES = ("float16", "float32", "float64")
_TINY = np.sqrt(sys.float_info.min)  # Horovod's sqrt(DBL_MIN): a smaller norm counts as zero
_TAG = 0x4ADA  # point-to-point tag on hpcrep's private communicator


def is_power_of_two(n: int) -> bool:
    """Return True if ``n`` is 1, 2, 4, 8, ... Local."""
    return n > 0 and n & (n - 1) == 0


def check(dtypes: Sequence[Any], size: int) -> None:
    """Raise :class:`CollectiveUnsupportedError` (a ``NotImplementedError``) unless Adasum can
    reduce arrays of ``dtypes`` over ``size`` ranks. Local: every rank knows both, so every rank
    raises together, before anything is sent."""
    names = {d if isinstance(d, str) else np.dtype(d).name for d in dtypes}
    bad = sorted(names - set(DTYPES))
    if bad:
        raise CollectiveUnsupportedError(
            f"op=Adasum reduces float16, float32 and float64 tensors (as Horovod's), got "
            f"{', '.join(bad)}; cast them to a floating dtype or use op=Sum/Average.")
    if not is_power_of_two(size):
        raise CollectiveUnsupportedError(
            f"Running Adasum with non-power of 2 ranks is not supported yet (as in Horovod): "
            f"{size} ranks; run on 1, 2, 4, 8, ... ranks or use op=Average.")


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ``adasum(a, b)`` of one tensor's values, in ``a``'s dtype. Local, pure numpy.

    ``a`` is the lower rank group's value; the result does not depend on the order in exact
    arithmetic, and hpcrep always passes the lower group's first so every rank computes the same
    bits.
    """
    a64 = np.asarray(a, dtype=np.float64).reshape(-1)
    b64 = np.asarray(b, dtype=np.float64).reshape(-1)
    dot = float(np.add.reduce(a64 * b64))
    anormsq = float(np.add.reduce(a64 * a64))
    bnormsq = float(np.add.reduce(b64 * b64))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _TINY else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _TINY else 1.0
    return (acoeff * a64 + bcoeff * b64).astype(np.asarray(a).dtype).reshape(np.shape(a))


def reduce_bucket(comm: Any, buf: np.ndarray, bucket: Bucket) -> None:
    """Replace ``buf`` (one fusion bucket, this rank's values) by the Adasum of every rank's, per
    slot of ``bucket``, in place.

    Collective over ``comm`` (an mpi4py communicator of a power-of-two size, checked by the
    caller with :func:`check`): every rank must call it with the same bucket; the caller holds
    the collective lock.
    """
    size, me = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return
    theirs = np.empty_like(buf)
    level = 1
    while level < size:
        partner = me ^ level
        comm.Sendrecv(buf.view(np.uint8), dest=partner, sendtag=_TAG,
                      recvbuf=theirs.view(np.uint8), source=partner, recvtag=_TAG)
        lower, upper = (buf, theirs) if me & level == 0 else (theirs, buf)
        for slot in bucket.slots:
            piece = slice(slot.offset, slot.offset + slot.count)
            buf[piece] = combine(lower[piece], upper[piece])
        level <<= 1
