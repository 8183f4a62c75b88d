"""MPI datatypes and reduction operations for numpy dtypes.

Standard numeric dtypes map to MPI's predefined types and operations. Half-precision types
(``float16``, and ``bfloat16`` from ml_dtypes) have no reduction in MPI, so they travel as 16-bit
words and are reduced by a user-defined operation that adds them with numpy: the message stays at
two bytes per element, which is the point of fp16 compression.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from hpcrep.comm.ops import ReduceOp, mpi_op

_HALF = ("float16", "bfloat16")


@functools.lru_cache(maxsize=None)
def _half_op(dtype_name: str, op: ReduceOp) -> Any:
    from mpi4py import MPI  # noqa: PLC0415

    dtype = np.dtype(dtype_name) if dtype_name == "float16" else _bfloat16()
    combine = {ReduceOp.Average: np.add, ReduceOp.Sum: np.add, ReduceOp.Min: np.minimum,
               ReduceOp.Max: np.maximum, ReduceOp.Product: np.multiply}[op]

    def reduce(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        a = np.frombuffer(inbuf, dtype=dtype)
        b = np.frombuffer(inoutbuf, dtype=dtype)
        combine(a, b, out=b)

    return MPI.Op.Create(reduce, commute=True)


def _bfloat16() -> np.dtype:
    import ml_dtypes  # noqa: PLC0415 - only needed when bfloat16 arrays are reduced

    return np.dtype(ml_dtypes.bfloat16)


def mpi_type_and_op(dtype: np.dtype, op: ReduceOp) -> tuple[Any, Any]:
    """Return the MPI datatype and operation that reduce arrays of ``dtype`` with ``op``.

    Raises:
        TypeError: numpy has no MPI equivalent for ``dtype``.
    """
    from mpi4py import MPI  # noqa: PLC0415

    if dtype.name in _HALF:
        return MPI.UINT16_T, _half_op(dtype.name, op)
    try:
        return MPI.Datatype.fromcode(dtype.char), mpi_op(op)
    except (KeyError, ValueError, MPI.Exception):  # no such code, or MPI lacks the type
        raise TypeError(f"cannot reduce arrays of dtype {dtype.name} over MPI; use a numeric "
                        "dtype (float16/32/64, bfloat16, int8..int64, uint8..uint64, complex)"
                        ) from None


def mpi_reduce_args(buf: np.ndarray, op: ReduceOp, out: Optional[np.ndarray] = None
                    ) -> tuple[Any, Any, Any]:
    """Return ``(sendbuf, recvbuf, op)`` for a reduction of ``buf`` (in place unless ``out``)."""
    from mpi4py import MPI  # noqa: PLC0415

    mpi_type, mpi_operation = mpi_type_and_op(buf.dtype, op)
    if out is None:
        return MPI.IN_PLACE, [buf, mpi_type], mpi_operation
    return [buf, mpi_type], [out, mpi_type], mpi_operation
