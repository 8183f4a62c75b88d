"""Collectives on numpy arrays over hpcrep's private communicator.

Every public function here is collective: every rank must call it, in the same order, with arrays
of the same dtype and shape (for allgather and alltoall, all but the first dimension). Before any
data moves, :func:`hpcrep.comm.uneven.agree` (:func:`hpcrep.comm.check.agree` plus what ranks
waiting in ``join()`` need) verifies that, so a mismatch raises
:class:`~hpcrep.errors.CollectiveMismatchError` on every rank instead of hanging.

Results are new arrays (views of pooled, aligned buffers; see :mod:`hpcrep.comm.fusion`); inputs
are never modified.

Every function takes ``communicator=``: a :class:`~hpcrep.comm.communicator.Communicator`, a
:class:`~hpcrep.comm.process_sets.ProcessSet`, or None for the current one (the job's world
unless inside :func:`hpcrep.comm.current.using`). "Every rank" then means every rank of that
communicator; ``root_rank`` is always a job rank (``hpcrep.comm.rank()`` of the root), as in
Horovod, and ranks outside a process set that call one of its collectives get a
:class:`~hpcrep.errors.CollectiveArgumentError` before anything is sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from hpcrep import config
from hpcrep.comm import adasum, check, flight, fusion, recovery, timeline, uneven, watchdog
from hpcrep.comm.current import resolve
from hpcrep.comm.dtypes import mpi_reduce_args
from hpcrep.comm.ops import ReduceOp, as_reduce_op
from hpcrep.errors import CollectiveArgumentError

# Collectives are atomic per process: two threads must not interleave messages on one comm.
_lock = threading.RLock()


@contextlib.contextmanager
def collective(kind: str, names: Sequence[str] = (), arrays: Sequence[Any] = (),
               communicator: Any = None) -> Iterator[None]:
    """Hold the collective lock, with the stall watchdog watching this call (see watchdog).

    Wrap any MPI call on hpcrep's communicators made outside this module (the compiled path's
    ``Dup``, for one) so that it never interleaves with another thread's collective. While the
    timeline records, the call is one of its collectives (:mod:`hpcrep.comm.timeline`); the
    flight recorder records it with ``arrays``' dtypes and shapes and the name of
    ``communicator`` (:mod:`hpcrep.comm.flight`). Where the MPI lets survivors go on (ULFM),
    an MPI error that reports a failed rank becomes :class:`~hpcrep.errors.RankFailedError`
    (:mod:`hpcrep.comm.recovery`). Local (it communicates nothing itself); the caller's MPI
    call inside it is what is collective.
    """
    with _lock, watchdog.watching(kind, names), timeline.collective(kind, names), \
            flight.recording(kind, names, arrays, _group_name(communicator)):
        try:
            yield
        except Exception as exc:  # a failed rank (ULFM) becomes RankFailedError
            if recovery.note(exc):
                recovery.raise_failure(exc)
            raise


def _group_name(communicator: Any) -> str:
    """The name of the communicator a collective runs on, for the flight recorder."""
    try:
        return resolve(communicator).name
    except Exception:  # noqa: BLE001 - the collective itself reports a bad communicator
        return repr(communicator)




def _names(arrays: Sequence[Any], name: Optional[str], prefix: str) -> list[str]:
    if name is None:
        return [f"{prefix}.{i}" for i in range(len(arrays))]
    if len(arrays) == 1:
        return [name]
    return [f"{name}.{i}" for i in range(len(arrays))]


def _as_arrays(arrays: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(a) for a in arrays]


def _agree(comm: Any, kind: str, params: tuple, arrays: Sequence[np.ndarray],
           names: Sequence[str], free_first_dim: bool = False) -> None:
    if config.get("HPCREP_CHECK_COLLECTIVES") and not uneven.replaying():
        with timeline.phase("negotiate"):
            uneven.agree(comm, (kind, params, check.entries(arrays, names, free_first_dim)))


def check_scale_factors(op: ReduceOp, prescale: float, postscale: float) -> None:
    """Raise :class:`CollectiveArgumentError` unless the scale factors suit ``op`` (Sum, Average
    and, as in Horovod, Adasum take them). Local."""
    if (prescale != 1.0 or postscale != 1.0) and op not in (ReduceOp.Sum, ReduceOp.Average,
                                                            ReduceOp.Adasum):
        raise CollectiveArgumentError(
            f"prescale_factor and postscale_factor apply only to Sum and Average, but op={op.name} "
            f"was given with prescale_factor={prescale}, postscale_factor={postscale}; drop the "
            "factors or use op=Sum.")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """The arithmetic around a sum across ranks, for allreduce and reducescatter alike.

    ``pre`` multiplies each rank's values as they are copied into the send buffer: the
    ``prescale_factor`` and, for ``Average`` of floating dtypes, ``1/size`` (folded into that
    copy, so it costs nothing extra). :meth:`finish` then works on the reduced buffer in place:
    ``Average`` of integer dtypes is a floor division of the sum by ``size``; then
    ``postscale_factor``. The compiled op (hpcrep/tensorflow/native) does the same arithmetic
    in the same order, so both paths give the same bits.
    """

    pre: float
    divide: int  # floor-divide the sum by this (integer Average), or 1
    post: float

    @classmethod
    def of(cls, op: ReduceOp, dtype: np.dtype, size: int, prescale: float,
           postscale: float) -> "Scaling":
        """Return the scaling of ``op`` over ``size`` ranks for arrays of ``dtype``. Local."""
        floating = dtype.kind in "fc" or dtype.name == "bfloat16"
        average = op is ReduceOp.Average
        return cls(prescale * (1.0 / size if average and floating else 1.0),
                   size if average and not floating else 1, postscale)

    def finish(self, buf: np.ndarray) -> None:
        """Apply the integer average and ``postscale`` to reduced ``buf`` in place. Local."""
        if self.divide != 1:
            np.floor_divide(buf, self.divide, out=buf)
        if self.post != 1.0:
            np.multiply(buf, self.post, out=buf, casting="unsafe")


def hierarchical(target: Any) -> bool:
    """Whether allreduces on ``target`` go through node leaders (HPCREP_HIERARCHICAL_ALLREDUCE).

    Equal on every rank of ``target``. Local.
    """
    return (target.nodes > 1 and target.widest_node > 1
            and bool(config.get("HPCREP_HIERARCHICAL_ALLREDUCE")))



def nonblocking(target: Any) -> bool:
    """Whether flat allreduces on ``target`` use ``MPI_Iallreduce`` (its ranks span nodes, where
    the network sets the pace) rather than the blocking ``MPI_Allreduce`` (one node: shared
    memory, where the blocking call was 3x faster). Both allreduce paths ask this, so they run the
    same algorithm and give the same bits; equal on every rank. Local."""
    return target.nodes > 1


def chunks(count: int, itemsize: int, chunk_bytes: int) -> list[slice]:
    """Return the consecutive pieces, of at most ``chunk_bytes`` (``HPCREP_ALLREDUCE_CHUNK``; 0
    or less: no limit), in which a buffer of ``count`` items is allreduced. The compiled op cuts
    buffers the same way (``AllreduceLarge`` in hpcrep/tensorflow/native/execute.cc), so both
    paths give the same bits. Local."""
    per = max(1, chunk_bytes // itemsize) if chunk_bytes > 0 else max(count, 1)
    pieces = [slice(start, min(start + per, count)) for start in range(0, count, per)]
    return pieces or [slice(0, 0)]


def _allreduce_in_place(target: Any, buf: np.ndarray, op: ReduceOp, hierarchical: bool) -> None:
    """Reduce ``buf`` across ``target``'s ranks in place: flat, in pieces (:func:`chunks`) of
    ``MPI_Allreduce`` within one node and of ``MPI_Iallreduce`` across nodes, as the compiled path
    does (so both give the same bits), or
    hierarchically, sending one copy of the buffer per node over the network instead of one per
    rank. With the same number of ranks on every node, the node's ranks reduce-scatter the
    buffer through shared memory, each allreduces its share with the ranks of the same local
    rank on the other nodes (the node's ranks use the link side by side), and they allgather
    the shares. Otherwise one leader per node reduces, allreduces with the other leaders and
    broadcasts. Every rank ends with the same bits either way.

    Collective over ``target``; the caller holds the collective lock.
    """
    from mpi4py import MPI  # noqa: PLC0415

    _, recvbuf, mpi_op = mpi_reduce_args(buf, op)
    if not hierarchical:
        mpi_type, polled = recvbuf[1], nonblocking(target)  # buf: a 1-D pooled fusion buffer
        for piece in chunks(buf.size, buf.itemsize, config.get("HPCREP_ALLREDUCE_CHUNK")):
            if polled:
                target.comm.Iallreduce(MPI.IN_PLACE, [buf[piece], mpi_type], op=mpi_op).Wait()
            else:
                target.comm.Allreduce(MPI.IN_PLACE, [buf[piece], mpi_type], op=mpi_op)
        return
    local, cross, mpi_type = target.local, target.cross, recvbuf[1]
    if target.widest_node == target.narrowest_node:
        width, me = local.Get_size(), local.Get_rank()
        counts = np.full(width, buf.size // width, dtype=np.int64)
        counts[: buf.size % width] += 1
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        with fusion.POOL.take(buf.dtype, int(counts[me])) as share:  # scratch: back at the end
            local.Reduce_scatter([buf, mpi_type], [share, mpi_type], recvcounts=counts.tolist(),
                                 op=mpi_op)
            cross.Allreduce(MPI.IN_PLACE, [share, mpi_type], op=mpi_op)
            local.Allgatherv([share, mpi_type], [buf, counts.tolist(), displs.tolist(), mpi_type])
        return
    if local.Get_rank() == 0:
        local.Reduce(MPI.IN_PLACE, recvbuf, op=mpi_op, root=0)
        cross.Allreduce(MPI.IN_PLACE, recvbuf, op=mpi_op)
    else:
        local.Reduce(recvbuf, None, op=mpi_op, root=0)
    local.Bcast(recvbuf, root=0)


def allreduce_into_buckets(arrays: Sequence[Any], buckets: Sequence[fusion.Bucket],
                           op: Any = ReduceOp.Average, prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0, name: Optional[str] = None,
                           communicator: Any = None) -> list[np.ndarray]:
    """Reduce arrays across ranks into the fusion buffers of ``buckets``; return the buffers.

    ``buckets`` is the plan (:func:`hpcrep.comm.fusion.plan` of the arrays' shapes and dtypes in
    call order): the caller makes it once and uses it again to find array ``i`` at
    ``buffer[slot.offset:slot.offset + slot.count]`` of the bucket whose slot has index ``i``
    (:mod:`hpcrep.tensorflow.fused` splits the buffers that way without copying). The arrays are
    packed into pooled, aligned buffers (one copy, with any scaling folded into it) and reduced in
    place, one MPI call per buffer. The buffers belong to the caller until it drops them and every
    view of them (:meth:`hpcrep.comm.fusion.Lease.hand_over`): only then does the pool lend them
    again.

    ``Average`` of floating arrays folds ``1/size`` into the packing copy (so it costs nothing
    extra); for integer arrays it is a floor division of the sum. ``Adasum`` (float16/32/64, a
    power-of-two number of ranks, else ``CollectiveUnsupportedError`` on every rank) combines
    each bucket point to point (:mod:`hpcrep.comm.adasum`), per tensor.

    Not part of the public API (:func:`grouped_allreduce` is). Collective: every rank must call
    this, in the same order, with the same number of arrays and equal dtypes and shapes.
    """
    op = as_reduce_op(op)
    check_scale_factors(op, prescale_factor, postscale_factor)
    arrays = _as_arrays(arrays)
    names = _names(arrays, name, "allreduce")
    with collective("allreduce", names, arrays, communicator):
        target = resolve(communicator)  # .comm; .local and .cross for hierarchical reductions
        comm = target.comm
        by_node = hierarchical(target)
        # HPCREP_HIERARCHICAL_ALLREDUCE (like every setting that picks MPI calls) was checked to
        # be equal on every rank by init(), so it is not part of the agreement.
        _agree(comm, "allreduce", (op.name, prescale_factor, postscale_factor), arrays, names)
        n = comm.Get_size()
        if op is ReduceOp.Adasum:  # after the agreement: every rank has these dtypes, raises alike
            adasum.check([b.dtype for b in buckets], n)
        buffers = []
        for index, bucket in enumerate(buckets):
            scaling = Scaling.of(op, bucket.dtype, n, prescale_factor, postscale_factor)
            fused = timeline.on() and {"bucket": index,
                                       "tensors": [names[s.index] for s in bucket.slots]}
            # Handed over: the caller's results are views of it (no copy out); the buffer returns
            # to the pool once the last of them is gone.
            with timeline.phase("pack", **(fused or {})):
                buf = fusion.pack(bucket, arrays, scaling.pre).hand_over()
            with timeline.phase("mpi", buf.nbytes if n > 1 else 0, **(fused or {})):
                if n > 1 and op is ReduceOp.Adasum:
                    adasum.reduce_bucket(comm, buf, bucket)
                elif n > 1:
                    _allreduce_in_place(target, buf, op, by_node)
            with timeline.phase("unpack", **(fused or {})):
                scaling.finish(buf)
            buffers.append(buf)
        return buffers


def plan_of(arrays: Sequence[np.ndarray]) -> tuple[fusion.Bucket, ...]:
    """Return the fusion plan of ``arrays`` at ``HPCREP_FUSION_THRESHOLD``. Local."""
    return fusion.plan(tuple((a.shape, a.dtype.name) for a in arrays),
                       config.get("HPCREP_FUSION_THRESHOLD"))


def grouped_allreduce(arrays: Sequence[Any], op: Any = ReduceOp.Average,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      name: Optional[str] = None, communicator: Any = None) -> list[np.ndarray]:
    """Reduce each array elementwise across ranks; return the results in the same order.

    Arrays are fused into few buffers (``HPCREP_FUSION_THRESHOLD``); see
    :func:`allreduce_into_buckets` for how, and for how Average is computed.

    Collective: every rank must call this, in the same order, with the same number of arrays and
    equal dtypes and shapes.
    """
    arrays = _as_arrays(arrays)
    buckets = plan_of(arrays)
    buffers = allreduce_into_buckets(arrays, buckets, op, prescale_factor, postscale_factor,
                                     name, communicator)
    out: list = [None] * len(arrays)
    for bucket, buf in zip(buckets, buffers):
        fusion.unpack(bucket, buf, [a.shape for a in arrays], out)
    return out


def allreduce(array: Any, op: Any = ReduceOp.Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              communicator: Any = None) -> np.ndarray:
    """Reduce ``array`` elementwise across ranks (see :func:`grouped_allreduce`).

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return grouped_allreduce([array], op, prescale_factor, postscale_factor, name,
                             communicator)[0]


def grouped_broadcast(arrays: Sequence[Any], root_rank: int = 0,
                      name: Optional[str] = None, communicator: Any = None) -> list[np.ndarray]:
    """Return rank ``root_rank``'s values of ``arrays`` on every rank, fused into few messages.

    Collective: every rank must call this, in the same order, with equal dtypes and shapes.
    """
    arrays = _as_arrays(arrays)
    names = _names(arrays, name, "broadcast")
    with collective("broadcast", names, arrays, communicator):
        target = resolve(communicator)
        comm, root = target.comm, target.root(root_rank)
        _agree(comm, "broadcast", (int(root_rank),), arrays, names)
        is_root = comm.Get_rank() == root
        layout = tuple((a.shape, a.dtype.name) for a in arrays)
        out: list = [None] * len(arrays)
        for bucket in fusion.plan(layout, config.get("HPCREP_FUSION_THRESHOLD")):
            with timeline.phase("pack"):
                buf = fusion.pack(bucket, arrays, fill=is_root).hand_over()  # results are views
            if comm.Get_size() > 1:
                with timeline.phase("mpi", buf.nbytes):
                    comm.Bcast(buf.view(np.uint8), root=root)
            with timeline.phase("unpack"):
                fusion.unpack(bucket, buf, [a.shape for a in arrays], out)
        return out


def broadcast(array: Any, root_rank: int = 0, name: Optional[str] = None,
              communicator: Any = None) -> np.ndarray:
    """Return rank ``root_rank``'s value of ``array`` on every rank.

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return grouped_broadcast([array], root_rank, name, communicator)[0]


def grouped_allgather(arrays: Sequence[Any], name: Optional[str] = None,
                      communicator: Any = None) -> list[np.ndarray]:
    """Concatenate each array's values from all ranks along the first dimension, rank order.

    The first dimension may differ by rank; the others and the dtype must agree.

    Collective: every rank must call this, in the same order, with the same number of arrays.
    """
    return grouped_allgatherv(arrays, name, communicator)[0]


def grouped_allgatherv(arrays: Sequence[Any], name: Optional[str] = None,
                       communicator: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Like :func:`grouped_allgather`, and also return the rows each rank gave, ``[size, n]``.

    One small allgather exchanges every array's first dimension together with the agreement hash.

    Collective: every rank must call this, in the same order, with the same number of arrays.
    """
    arrays = [np.ascontiguousarray(a) for a in _as_arrays(arrays)]
    for a, nm in zip(arrays, _names(arrays, name, "allgather")):
        if a.ndim == 0:
            raise CollectiveArgumentError(
                f"allgather of {nm!r} needs an array with at least one dimension, got a scalar; "
                "reshape it to [1] first.")
    names = _names(arrays, name, "allgather")
    with collective("allgather", names, arrays, communicator):
        comm = resolve(communicator).comm
        _agree(comm, "allgather", (), arrays, names, free_first_dim=True)  # also serves join()
        signature = ("allgather", (), check.entries(arrays, names, free_first_dim=True))
        mine = np.array([check.signature_hash(signature)] + [a.shape[0] for a in arrays],
                        dtype=np.int64)
        table = np.empty((comm.Get_size(), mine.size), dtype=np.int64)
        comm.Allgather(mine, table)
        if config.get("HPCREP_CHECK_COLLECTIVES") and (table[:, 0] != table[0, 0]).any():
            raise check.CollectiveMismatchError(check.mismatch_message(comm.allgather(signature)))
        out = []
        for i, a in enumerate(arrays):
            rows = table[:, i + 1]
            row = int(np.prod(a.shape[1:], dtype=np.int64))
            result = fusion.POOL.take(a.dtype, int(rows.sum()) * row).hand_over()  # the result
            counts = (rows * row).astype(np.int64)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            with timeline.phase("mpi", result.nbytes):
                comm.Allgatherv(a.view(np.uint8).reshape(-1),
                                [result.view(np.uint8), (counts * a.itemsize,
                                                         displs * a.itemsize)])
            out.append(result.reshape((int(rows.sum()),) + a.shape[1:]))
        return out, table[:, 1:]


def allgather(array: Any, name: Optional[str] = None, communicator: Any = None) -> np.ndarray:
    """Concatenate ``array`` from all ranks along the first dimension (see grouped_allgather).

    Collective: every rank must call this, in the same order.
    """
    return grouped_allgather([array], name, communicator)[0]


def allgatherv(array: Any, name: Optional[str] = None,
               communicator: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``array`` gathered from all ranks and the number of rows each rank gave.

    Collective: every rank must call this, in the same order.
    """
    gathered, rows = grouped_allgatherv([array], name, communicator)
    return gathered[0], rows[:, 0]


def alltoall(array: Any, splits: Optional[Sequence[int]] = None,
             name: Optional[str] = None, communicator: Any = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Send ``splits[j]`` consecutive rows of ``array`` to rank j; return what arrived, and its
    splits.

    Without ``splits`` the first dimension is divided evenly (it must be a multiple of size).
    Returns ``(received, received_splits)``: rows from rank 0 first, then rank 1, and so on.

    Collective: every rank must call this, in the same order, with equal dtype and trailing shape.
    """
    a = np.ascontiguousarray(np.asarray(array))
    nm = name or "alltoall.0"
    with collective("alltoall", [nm], [a], communicator):
        comm = resolve(communicator).comm
        n = comm.Get_size()
        send_rows, problem = _alltoall_rows(a, splits, n, nm)
        # The verdict is part of the agreement, so a bad argument on some ranks is an error on
        # every rank (a mismatch), never a hang; bad arguments on all ranks raise it everywhere.
        _agree(comm, "alltoall", ("arguments ok" if problem is None else "bad arguments",), [a],
               [nm], free_first_dim=True)
        if problem is not None:
            raise CollectiveArgumentError(problem)
        recv_rows = np.empty(n, dtype=np.int64)
        comm.Alltoall(send_rows, recv_rows)
        row = int(np.prod(a.shape[1:], dtype=np.int64))
        result = fusion.POOL.take(a.dtype, int(recv_rows.sum()) * row).hand_over()  # the result
        sc, rc = send_rows * row * a.itemsize, recv_rows * row * a.itemsize
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        with timeline.phase("mpi", int(sc.sum())):
            comm.Alltoallv([a.view(np.uint8).reshape(-1), (sc, sd)],
                           [result.view(np.uint8), (rc, rd)])
        return result.reshape((int(recv_rows.sum()),) + a.shape[1:]), recv_rows


def _alltoall_rows(a: np.ndarray, splits: Optional[Sequence[int]], n: int,
                   nm: str) -> tuple[Optional[np.ndarray], Optional[str]]:
    """Return the rows to send to each rank, or None and what is wrong with the arguments."""
    if a.ndim == 0:
        return None, f"alltoall of {nm!r} needs an array with at least one dimension, got a scalar."
    if splits is None:
        if a.shape[0] % n:
            return None, (f"alltoall of {nm!r} without splits needs a first dimension divisible "
                          f"by the number of ranks ({n}), got shape {list(a.shape)}; pass "
                          f"splits=[...] with {n} entries that sum to {a.shape[0]}.")
        return np.full(n, a.shape[0] // n, dtype=np.int64), None
    send_rows = np.asarray(splits, dtype=np.int64).reshape(-1)
    if send_rows.size != n or (send_rows < 0).any() or send_rows.sum() != a.shape[0]:
        return None, (f"alltoall of {nm!r}: splits must have one non-negative entry per rank "
                      f"({n}) summing to the first dimension {a.shape[0]}; got "
                      f"{list(send_rows)}.")
    return send_rows, None


def grouped_reducescatter(arrays: Sequence[Any], op: Any = ReduceOp.Average,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None,
                          communicator: Any = None) -> list[np.ndarray]:
    """Reduce each array across ranks and return this rank's share of its first dimension.

    Rows are divided as evenly as possible; the first ``rows % size`` ranks get one extra row.
    ``op`` is Sum or Average (or Min, Max, Product without scale factors). One agreement covers
    the group, then the arrays are reduced in list order: a group is one collective, so it can
    never pair one rank's array with another rank's different array of the same shape.

    Collective: every rank must call this, in the same order, with the same number of arrays and
    equal dtypes and shapes.
    """
    op = as_reduce_op(op)
    if op is ReduceOp.Adasum:
        raise CollectiveArgumentError("reducescatter cannot use op=Adasum; use Sum or Average")
    check_scale_factors(op, prescale_factor, postscale_factor)
    arrays = _as_arrays(arrays)
    names = _names(arrays, name, "reducescatter")
    with collective("reducescatter", names, arrays, communicator):
        comm = resolve(communicator).comm
        _agree(comm, "reducescatter", (op.name, prescale_factor, postscale_factor), arrays,
               names)
        for a, nm in zip(arrays, names):  # after the agreement: ranks passing a scalar all raise
            if a.ndim == 0:
                raise CollectiveArgumentError(
                    f"reducescatter of {nm!r} needs an array with at least one dimension to "
                    "scatter, got a scalar; reshape it to [1] (or allreduce it instead).")
        return [_reducescatter_one(comm, a, op, prescale_factor, postscale_factor)
                for a in arrays]


def _reducescatter_one(comm: Any, a: np.ndarray, op: ReduceOp, prescale: float,
                       postscale: float) -> np.ndarray:
    """Reduce-scatter one agreed array on ``comm``; the caller holds the collective lock."""
    n, me = comm.Get_size(), comm.Get_rank()
    scaling = Scaling.of(op, a.dtype, n, prescale, postscale)
    rows = np.full(n, a.shape[0] // n, dtype=np.int64)
    rows[: a.shape[0] % n] += 1
    row = int(np.prod(a.shape[1:], dtype=np.int64))
    result = fusion.POOL.take(a.dtype, int(rows[me]) * row).hand_over()  # the result
    with fusion.POOL.take(a.dtype, a.size) as send:  # scratch: back once reduced
        if scaling.pre == 1.0:
            np.copyto(send, a.reshape(-1))
        else:
            np.multiply(a.reshape(-1), scaling.pre, out=send, casting="unsafe")
        if n > 1:
            sendbuf, recvbuf, mpi_op = mpi_reduce_args(send, op, out=result)
            with timeline.phase("mpi", send.nbytes):
                comm.Reduce_scatter(sendbuf, recvbuf, recvcounts=list(rows * row), op=mpi_op)
        else:
            np.copyto(result, send)
    scaling.finish(result)
    return result.reshape((int(rows[me]),) + a.shape[1:])


def reducescatter(array: Any, op: Any = ReduceOp.Average, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, name: Optional[str] = None,
                  communicator: Any = None) -> np.ndarray:
    """Reduce ``array`` across ranks and return this rank's share of the first dimension (see
    :func:`grouped_reducescatter`).

    Collective: every rank must call this, in the same order, with equal dtype and shape.
    """
    return grouped_reducescatter([array], op, prescale_factor, postscale_factor, name,
                                 communicator)[0]


def broadcast_object(obj: Any, root_rank: int = 0, communicator: Any = None) -> Any:
    """Return rank ``root_rank``'s ``obj`` (pickled) on every rank.

    Collective: every rank must call this, in the same order.
    """
    with collective("broadcast_object", communicator=communicator):
        target = resolve(communicator)
        return target.comm.bcast(obj, root=target.root(root_rank))


def allgather_object(obj: Any, communicator: Any = None) -> list:
    """Return the list of every rank's ``obj`` (pickled), in rank order.

    Collective: every rank must call this, in the same order.
    """
    with collective("allgather_object", communicator=communicator):
        return resolve(communicator).comm.allgather(obj)


def barrier(communicator: Any = None) -> None:
    """Wait until every rank has called this.

    Collective: every rank must call this.
    """
    with collective("barrier", communicator=communicator):
        comm = resolve(communicator).comm
        with timeline.phase("mpi"):
            comm.Barrier()
