"""The compiled library's C interface (``c_api.cc``) as a small typed class.

Plain ctypes calls: nothing here imports TensorFlow or knows about communicators beyond the MPI
handle it passes. :mod:`hpcrep.tensorflow.native` loads one :class:`Library` per process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
from typing import Optional

from hpcrep.comm.ops import ReduceOp


class ErrorKind(enum.IntEnum):
    """Why the compiled op failed: the code an engine error carries (``ErrorKind`` in common.h).

    TensorFlow hands it over as the error's payload :data:`PAYLOAD_KEY`;
    :func:`hpcrep.tensorflow.fused` maps it to hpcrep's error types.
    """

    MISMATCH = 1  # ranks passed different requests at the same point
    JOIN = 2      # a request that cannot run while a rank waits in join()
    MPI = 3       # MPI returned an error code
    FREED = 4     # the op names an engine that has been unregistered


PAYLOAD_KEY = "hpcrep.error"
# The reductions the op takes, in the order hpcrep_native_reduce_ops() reports them.
REDUCE_OPS = (ReduceOp.Average, ReduceOp.Sum, ReduceOp.Min, ReduceOp.Max, ReduceOp.Product)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """What an engine is registered with: equal on every rank (hpcrep.config's values)."""

    check: bool            # HPCREP_CHECK_COLLECTIVES: compare signatures every cycle
    fusion_bytes: int      # HPCREP_FUSION_THRESHOLD
    spin_micros: int       # HPCREP_NATIVE_SPIN_US
    polled: bool           # MPI_Iallreduce polled (ranks span nodes), else MPI_Allreduce
    match_timeout: float = 30.0  # HPCREP_MATCH_TIMEOUT: seconds pending names may fail to meet


class Library:
    """The loaded ``_hpcrep_ops.so``: one method per C function. Every method is local."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        i64, p64 = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        lib.hpcrep_native_register.restype = i64
        lib.hpcrep_native_register.argtypes = [i64, ctypes.c_int, i64, ctypes.c_int, ctypes.c_int,
                                               ctypes.c_double]
        lib.hpcrep_native_unregister.argtypes = [i64]
        lib.hpcrep_native_tune.argtypes = [i64, i64, i64, ctypes.c_int]
        lib.hpcrep_native_begin_join.argtypes = [i64]
        lib.hpcrep_native_join_pending.argtypes = [i64]
        lib.hpcrep_native_join_pending.restype = ctypes.c_int
        lib.hpcrep_native_active_cycles.argtypes = [i64]
        lib.hpcrep_native_active_cycles.restype = i64
        lib.hpcrep_native_stats.argtypes = [i64, p64, p64]
        lib.hpcrep_native_busy.argtypes = [ctypes.c_char_p, i64]
        lib.hpcrep_native_busy.restype = ctypes.c_double
        lib.hpcrep_native_stragglers.argtypes = [i64, p64, p64, i64, p64]
        lib.hpcrep_native_stragglers.restype = i64
        lib.hpcrep_native_timeline_enable.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.hpcrep_native_timeline_read.argtypes = [i64, ctypes.c_void_p, i64, p64, p64]
        lib.hpcrep_native_timeline_read.restype = i64
        lib.hpcrep_native_timeline_layout.argtypes = [p64, p64]
        lib.hpcrep_native_timeline_layout.restype = i64
        for table in (lib.hpcrep_native_reduce_ops, lib.hpcrep_native_error_kinds):
            table.argtypes = [p64, ctypes.c_int]
            table.restype = ctypes.c_int
        self._lib = lib

    def register(self, comm_handle: int, settings: EngineSettings) -> int:
        """Start an engine on an MPI communicator handle (a duplicate of its own); return its id."""
        return self._lib.hpcrep_native_register(comm_handle, int(settings.check),
                                                settings.fusion_bytes, settings.spin_micros,
                                                int(settings.polled),
                                                float(settings.match_timeout))

    def unregister(self, engine_id: int) -> None:
        """Stop the engine's thread once what is queued has finished, and forget it."""
        self._lib.hpcrep_native_unregister(engine_id)

    def tune(self, engine_id: int, fusion_bytes: int, chunk_bytes: int,
             half_wire: bool = False) -> None:
        """Set the fusion threshold, piece size and fp16 wire that tuned requests take next."""
        self._lib.hpcrep_native_tune(engine_id, int(fusion_bytes), int(chunk_bytes),
                                     int(bool(half_wire)))

    def begin_join(self, engine_id: int) -> None:
        """Let the engine take part with zeros in the active ranks' allreduces."""
        self._lib.hpcrep_native_begin_join(engine_id)

    def join_pending(self, engine_id: int) -> bool:
        """Return True until the engine has seen every rank join."""
        return bool(self._lib.hpcrep_native_join_pending(engine_id))

    def active_cycles(self, engine_id: int) -> int:
        """Return the cycles this rank took part in with requests of its own (0: unknown)."""
        return int(self._lib.hpcrep_native_active_cycles(engine_id))

    def stats(self, engine_id: int) -> tuple[int, int]:
        """Return (cycles, requests) the engine has reduced; (0, 0) for an unknown engine."""
        cycles, reduced = ctypes.c_int64(), ctypes.c_int64()
        self._lib.hpcrep_native_stats(engine_id, ctypes.byref(cycles), ctypes.byref(reduced))
        return cycles.value, reduced.value

    def busy(self) -> Optional[tuple[float, str]]:
        """Return (since, what) of the longest current wait of any engine, or None."""
        text = ctypes.create_string_buffer(512)
        since = self._lib.hpcrep_native_busy(text, 512)
        return None if since <= 0 else (since, text.value.decode(errors="replace"))

    def stragglers(self, engine_id: int, limit: int = 4096) -> tuple[int, list[tuple[int, float]]]:
        """Return the engine's communicator size and, oldest first, the (last rank, seconds
        late) of each negotiation since the last call (engine.h: TakeStragglers)."""
        ranks, late = (ctypes.c_int64 * limit)(), (ctypes.c_int64 * limit)()
        size = ctypes.c_int64()
        n = self._lib.hpcrep_native_stragglers(engine_id, ranks, late, limit, ctypes.byref(size))
        return size.value, [(int(ranks[i]), late[i] * 1e-6) for i in range(n)]

    def timeline_enable(self, on: bool, mark_cycles: bool) -> None:
        """Start or stop stamping allreduces into the event ring (timeline.h)."""
        self._lib.hpcrep_native_timeline_enable(int(on), int(mark_cycles))

    def timeline_layout(self) -> tuple[int, int, int]:
        """Return (bytes per record, records in the ring, stamps per record)."""
        slots, stamps = ctypes.c_int64(), ctypes.c_int64()
        size = self._lib.hpcrep_native_timeline_layout(ctypes.byref(slots), ctypes.byref(stamps))
        return size, slots.value, stamps.value

    def timeline_read(self, cursor: int, out: ctypes.Array) -> tuple[int, int, int]:
        """Copy records written after ``cursor`` into ``out`` (an array of records); return
        (records copied, the next cursor, records lost to overwriting)."""
        nxt, lost = ctypes.c_int64(), ctypes.c_int64()
        n = self._lib.hpcrep_native_timeline_read(cursor, ctypes.cast(out, ctypes.c_void_p),
                                                  len(out), ctypes.byref(nxt),
                                                  ctypes.byref(lost))
        return n, nxt.value, lost.value

    def numbering_mismatch(self) -> Optional[str]:
        """Return how the library's numbering of reductions and errors differs from Python's
        (:data:`REDUCE_OPS`, :class:`ErrorKind`), or None if it agrees."""
        expected = {"reduce ops": [int(op) for op in REDUCE_OPS],
                    "error kinds": [int(kind) for kind in ErrorKind]}
        for label, fn in (("reduce ops", self._lib.hpcrep_native_reduce_ops),
                          ("error kinds", self._lib.hpcrep_native_error_kinds)):
            values = (ctypes.c_int64 * 16)()
            got = list(values[:fn(values, 16)])
            if got != expected[label]:
                return f"its {label} are numbered {got}, hpcrep's Python side {expected[label]}"
        return None
