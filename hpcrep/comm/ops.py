"""Reduction operations, with Horovod's names and values."""

from __future__ import annotations

import enum
from typing import Any


class ReduceOp(enum.IntEnum):
    """How a reducing collective combines the ranks' values (values match Horovod's)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum,
                                           ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)


def as_reduce_op(op: Any) -> ReduceOp:
    """Return ``op`` as a :class:`ReduceOp`; accepts the enum, its int value or its name.

    Raises:
        ValueError: ``op`` names no reduction.
    """
    try:
        result = ReduceOp[op] if isinstance(op, str) else ReduceOp(op)
    except (KeyError, ValueError):
        raise ValueError(f"unknown reduction op {op!r}; use one of Average, Sum, Adasum, Min, "
                         "Max, Product") from None
    return result


def mpi_op(op: ReduceOp) -> Any:
    """Return the MPI operation that implements ``op`` (Average is a Sum followed by a scale).

    Adasum has none: :mod:`hpcrep.comm.adasum` reduces it point to point.
    """
    from mpi4py import MPI  # noqa: PLC0415

    return {ReduceOp.Average: MPI.SUM, ReduceOp.Sum: MPI.SUM, ReduceOp.Min: MPI.MIN,
            ReduceOp.Max: MPI.MAX, ReduceOp.Product: MPI.PROD}[op]
