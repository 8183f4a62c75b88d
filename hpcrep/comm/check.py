"""Agreement checks that turn mismatched collectives into errors on every rank.

Before a collective moves data, every rank reduces a 64-bit hash of what it is about to do (the
collective, its parameters, and each tensor's name, dtype and shape) with one 16-byte MAX
allreduce of ``[h, -h]``. If the maximum and minimum hashes differ, the ranks gather their full
descriptions and every rank raises :class:`CollectiveMismatchError` naming the tensor and what each
rank passed. The steady-state cost is that one tiny allreduce per collective call; hashes are
computed once per distinct signature and cached.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Sequence

import numpy as np

from hpcrep.comm import flight
from hpcrep.errors import CollectiveMismatchError

# One tensor as seen by the check: (name, dtype name, shape); a shape entry of -1 means "may
# differ across ranks" (the first dimension of an allgather or alltoall).
Entry = tuple[str, str, tuple[int, ...]]
Signature = tuple[str, tuple[Any, ...], tuple[Entry, ...]]


def _signature_hash(signature: Signature) -> int:
    """Return a 62-bit hash of ``signature`` that is the same in every process.

    Tensor names are left out: they label tensors in error messages, but ranks may name the same
    tensor differently (auto-generated names), and that is not an error.
    """
    kind, params, entries_ = signature
    unnamed = (kind, params, tuple((dtype, shape) for _, dtype, shape in entries_))
    digest = hashlib.blake2b(repr(unnamed).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


# Cached by wrapping rather than by decorating: mutmut (make mutation) skips decorated functions.
signature_hash = functools.lru_cache(maxsize=4096)(_signature_hash)


def describe(entry: Entry) -> str:
    """Return ``float32[3, 4]`` for an entry; a free first dimension prints as ``*``."""
    _, dtype, shape = entry
    dims = ", ".join("*" if d < 0 else str(d) for d in shape)
    return f"{dtype}[{dims}]"


def _by_value(values: Sequence[Any]) -> str:
    """Return 'rank 0: A; ranks 1, 3: B' grouping ranks that passed the same value."""
    groups: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(str(v), []).append(r)
    parts = []
    for value, ranks in groups.items():
        label = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, ranks))} passed {value}")
    return "; ".join(parts)


def mismatch_message(signatures: Sequence[Signature]) -> str:
    """Explain how the ranks' signatures differ: the first difference, named precisely."""
    fix = ("Every rank must call the same collectives in the same order, with tensors of the "
           "same dtype and shape (for allgather and alltoall, all but the first dimension).")
    kinds = [s[0] for s in signatures]
    if len(set(kinds)) > 1:
        return f"ranks called different collectives at the same point: {_by_value(kinds)}. {fix}"
    kind = kinds[0]
    params = [s[1] for s in signatures]
    if len(set(params)) > 1:
        return f"hpcrep.{kind}: ranks disagree on parameters: {_by_value(params)}. {fix}"
    entries = [s[2] for s in signatures]
    counts = [len(e) for e in entries]
    if len(set(counts)) > 1:
        names = [", ".join(repr(n) for n, _, _ in e) for e in entries]
        return (f"hpcrep.{kind}: ranks passed different numbers of tensors: "
                f"{_by_value([f'{c} tensor(s)' for c in counts])}. Tensors by rank: "
                f"{_by_value(names)}. {fix}")
    for i in range(counts[0]):
        column = [e[i] for e in entries]
        if len({c[1:] for c in column}) > 1:
            what = _by_value([describe(c) if c[0] == column[0][0] else f"{c[0]!r} {describe(c)}"
                              for c in column])
            return (f"hpcrep.{kind}: ranks disagree on tensor {column[0][0]!r} (position {i} "
                    f"of {counts[0]}): {what}. {fix}")
    return f"hpcrep.{kind}: ranks disagree on the call signature. {fix}"


def agree(comm: Any, signature: Signature) -> None:
    """Raise :class:`CollectiveMismatchError` on every rank unless all ranks pass equal signatures.

    Collective: every rank of ``comm`` must call this, in the same order.
    """
    from mpi4py import MPI  # noqa: PLC0415

    h = signature_hash(signature)
    both = np.array([h, -h], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    if int(both[0]) == -int(both[1]):
        return
    signatures = comm.allgather(signature)
    flight.mismatch(comm)  # every rank writes its last collectives; the summary says where
    raise CollectiveMismatchError(mismatch_message(signatures))


def entries(arrays: Sequence[np.ndarray], names: Sequence[str], free_first_dim: bool = False
            ) -> tuple[Entry, ...]:
    """Return the check entries of ``arrays`` (first dimension marked free if asked)."""
    out = []
    for name, a in zip(names, arrays):
        shape = tuple(a.shape)
        if free_first_dim and shape:
            shape = (-1,) + shape[1:]
        out.append((name, a.dtype.name, shape))
    return tuple(out)
