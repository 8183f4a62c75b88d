"""hpcrep's compiled allreduce path: loading it, choosing it, and handing communicators to it.

The op (``hpcrep_ops.cc``, built by :mod:`hpcrep.tensorflow.native.build` at install time) runs
allreduces of dense numeric tensors (float16, bfloat16, float32, float64, int32, int64) on one
communication thread per communicator, calling MPI directly: a collective inside
``tf.function`` costs about a function call plus MPI's own time instead of a Python round trip,
independent allreduces issued in the same step are fused, and a gradient bucket's exchange starts
while the backward pass is still computing the next one. Everything else (other collectives,
other dtypes, hierarchical allreduce, XLA) takes the Python path (:mod:`hpcrep.tensorflow.bridge`).

``HPCREP_NATIVE`` chooses: ``auto`` (default) uses the op when it is built for this TensorFlow and
loads, else the Python path; ``on`` requires it (a clear error says why it is unavailable);
``off`` always takes the Python path. ``python -m hpcrep.tensorflow.native`` prints which path is
active and why.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import struct
import threading
import time
from typing import Any, Optional

from hpcrep import config
from hpcrep.errors import ConfigError

_HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(_HERE, "_hpcrep_ops.so")
STAMP = os.path.join(_HERE, "_hpcrep_ops.json")
MISMATCH = "hpcrep collective mismatch: "   # status prefixes set by hpcrep_ops.cc
JOIN_ERROR = "hpcrep join error: "
REDUCE_KINDS = {"Sum": 0, "Average": 1, "Min": 2, "Max": 3, "Product": 4}
DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")

_lock = threading.Lock()
_engines: dict[int, tuple[Any, int, Any]] = {}  # id(communicator) -> (communicator, engine, dup)
_hooked: list[bool] = []  # the watchdog probe and join hooks are installed once per process


def _unavailable_reason() -> Optional[str]:
    """Return why the compiled op cannot be used, or None if it can (does not load it)."""
    from hpcrep.tensorflow.native import build  # noqa: PLC0415

    if not os.path.exists(LIBRARY) or not os.path.exists(STAMP):
        return ("it has not been built; run `python -m hpcrep.tensorflow.native.build` (make "
                "install does) with an MPI C++ compiler (mpicxx) present")
    import tensorflow as tf  # noqa: PLC0415

    with open(STAMP) as f:
        stamp = json.load(f)
    if stamp.get("tensorflow") != tf.__version__:
        return (f"it was built for TensorFlow {stamp.get('tensorflow')} but {tf.__version__} is "
                "running; rebuild with `python -m hpcrep.tensorflow.native.build`")
    if stamp.get("source") != build.source_hash():
        return ("its source changed since it was built; rebuild with "
                "`python -m hpcrep.tensorflow.native.build`")
    return None


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, Any, Optional[str]]:
    """Load the op library once: (TensorFlow module of ops, ctypes handle, reason if absent)."""
    reason = _unavailable_reason()
    if reason is not None:
        return None, None, reason
    import tensorflow as tf  # noqa: PLC0415

    try:
        ops = tf.load_op_library(LIBRARY)
        lib = ctypes.CDLL(LIBRARY)
    except Exception as error:  # noqa: BLE001 - a broken build must not break the Python path
        return None, None, f"it failed to load ({error}); rebuild it"
    lib.hpcrep_native_register.restype = ctypes.c_int64
    lib.hpcrep_native_register.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
                                           ctypes.c_int, ctypes.c_int]
    lib.hpcrep_native_unregister.argtypes = [ctypes.c_int64]
    lib.hpcrep_native_begin_join.argtypes = [ctypes.c_int64]
    lib.hpcrep_native_join_pending.argtypes = [ctypes.c_int64]
    lib.hpcrep_native_join_pending.restype = ctypes.c_int
    lib.hpcrep_native_stats.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                        ctypes.POINTER(ctypes.c_int64)]
    lib.hpcrep_native_busy.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.hpcrep_native_busy.restype = ctypes.c_double
    return ops, lib, None


def status() -> tuple[bool, str]:
    """Return (whether allreduces take the compiled path, a sentence saying why). Local."""
    mode = config.get("HPCREP_NATIVE")
    if mode == "off":
        return False, "HPCREP_NATIVE=off: allreduces take the Python path"
    _, _, reason = _load()
    if reason is None:
        return True, f"the compiled op ({LIBRARY}) is active"
    if mode == "on":
        raise ConfigError(f"HPCREP_NATIVE=on but the compiled op cannot be used: {reason}. "
                          "Build it, or set HPCREP_NATIVE=auto to fall back to the Python path.")
    return False, f"the Python path is active: the compiled op cannot be used: {reason}"


def active() -> bool:
    """Return True if allreduces take the compiled path (see :func:`status`). Local."""
    return status()[0]


def handles(communicator: Any, dtype_name: str) -> bool:
    """Return True if an allreduce of ``dtype_name`` on ``communicator`` takes the compiled path.

    The answer depends on settings that are equal on every rank, never on the data, so every
    rank takes the same path. Local.
    """
    return (dtype_name in DTYPES and active()
            and not _hierarchical(communicator))


def _hierarchical(communicator: Any) -> bool:
    from hpcrep.comm.collectives import _hierarchical as hierarchical  # noqa: PLC0415

    return hierarchical(communicator)


def engine(communicator: Any) -> int:
    """Return the id of ``communicator``'s communication thread, starting it on first use.

    The thread gets a duplicate of the communicator of its own, so its MPI calls never interleave
    with the Python path's. Collective on first use for a communicator: every member must call
    this in the same order (tracing the same function does); later calls are local.
    """
    key = id(communicator)
    with _lock:
        entry = _engines.get(key)
        if entry is not None and entry[0] is communicator:
            return entry[1]
    from mpi4py import MPI  # noqa: PLC0415

    from hpcrep.comm import collectives, uneven, watchdog, world  # noqa: PLC0415

    _, lib, _ = _load()
    with collectives._collective("native.register"):
        dup = communicator.comm.Dup()
    dup.Set_name(f"hpcrep native {communicator.name}")
    engine_id = lib.hpcrep_native_register(MPI._handleof(dup),
                                           int(bool(config.get("HPCREP_CHECK_COLLECTIVES"))),
                                           int(config.get("HPCREP_FUSION_THRESHOLD")),
                                           int(config.get("HPCREP_NATIVE_SPIN_US")),
                                           int(collectives.nonblocking(communicator)))
    with _lock:
        if not _engines:
            world.at_shutdown(shutdown)
        if not _hooked:
            _hooked.append(True)
            watchdog.add_probe(_busy)
            uneven.on_join(lambda: begin_join(world.communicator()),
                           lambda: end_join(world.communicator()))
        _engines[key] = (communicator, engine_id, dup)
    communicator.at_free(lambda: _release(key))
    return engine_id


def _release(key: int) -> None:
    """Stop one communicator's thread and free its duplicate (collective over its members)."""
    with _lock:
        entry = _engines.pop(key, None)
    if entry is None:
        return
    _, engine_id, dup = entry
    _load()[1].hpcrep_native_unregister(engine_id)
    dup.Free()


def shutdown() -> None:
    """Stop every communication thread and free their communicators.

    Collective: every rank must call this (:func:`hpcrep.comm.shutdown` does, before MPI ends).
    """
    for key in sorted(list(_engines), key=lambda k: _engines[k][1]):
        _release(key)


@atexit.register
def _at_exit() -> None:
    # Threads must not be inside MPI when MPI finalises; what is queued has finished by now.
    lib = _load()[1] if _engines else None
    if lib is not None:
        for _, engine_id, _ in list(_engines.values()):
            lib.hpcrep_native_unregister(engine_id)
        _engines.clear()


def begin_join(communicator: Any) -> None:
    """Let ``communicator``'s thread take part, with zeros, in allreduces the active ranks run.

    Called by :func:`hpcrep.comm.uneven.join` on every rank that joins. Local.
    """
    entry = _engines.get(id(communicator))
    if entry is not None:
        _load()[1].hpcrep_native_begin_join(entry[1])


def end_join(communicator: Any) -> None:
    """Wait until the thread has seen every rank join (it leaves join mode with all of them)."""
    entry = _engines.get(id(communicator))
    if entry is None:
        return
    lib = _load()[1]
    while lib.hpcrep_native_join_pending(entry[1]):
        time.sleep(0.001)


def _busy() -> Optional[tuple[str, tuple[str, ...], float]]:
    """The stall watchdog's view of the threads: what the longest wait is for, and since when."""
    if not _engines:
        return None
    text = ctypes.create_string_buffer(512)
    since = _load()[1].hpcrep_native_busy(text, 512)
    if since <= 0:
        return None
    return "allreduce (compiled path)", (text.value.decode(errors="replace"),), since


def stats(communicator: Any) -> tuple[int, int]:
    """Return (cycles, requests) ``communicator``'s thread has reduced so far; (0, 0) if it has
    none. Fewer cycles than requests means requests were fused. Local."""
    entry = _engines.get(id(communicator))
    if entry is None:
        return 0, 0
    cycles, reduced = ctypes.c_int64(), ctypes.c_int64()
    _load()[1].hpcrep_native_stats(entry[1], ctypes.byref(cycles), ctypes.byref(reduced))
    return cycles.value, reduced.value


def bits(value: float) -> int:
    """Return the 64 bits of a double as a signed integer (how scale factors reach the op)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def ops() -> Any:
    """Return the loaded op module (``hpcrep_allreduce_enqueue``, ``hpcrep_allreduce_wait``)."""
    return _load()[0]
