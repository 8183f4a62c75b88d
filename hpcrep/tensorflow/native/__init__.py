"""hpcrep's compiled allreduce path: loading it, choosing it, and handing communicators to it.

The op (the C++ sources here, built by :mod:`hpcrep.tensorflow.native.build` at install time) runs
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
import dataclasses
import functools
import json
import os
import struct
import threading
import time
from typing import Any, Callable, Optional

from hpcrep import config
from hpcrep.comm import ulfm
from hpcrep.errors import ConfigError
from hpcrep.tensorflow.native.library import (PAYLOAD_KEY, REDUCE_OPS, EngineSettings, ErrorKind,
                                              Library)

__all__ = ["library_file", "DTYPES", "PAYLOAD_KEY", "REDUCE_OPS", "ErrorKind", "Engine",
           "Loaded", "status", "active", "engine", "shutdown", "begin_join", "end_join", "stats",
           "bits", "ops"]

DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")


@dataclasses.dataclass(frozen=True)
class Engine:
    """A communicator's communication thread: the communicator, the engine's id (the ops'
    ``engine`` attribute) and the duplicate communicator the thread talks on."""

    communicator: Any
    engine_id: int
    dup: Any
    rank: int = 0  # this process's rank in dup


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The compiled op, loaded: TensorFlow's op module and the library's C interface; or why
    it cannot be used."""

    ops: Any = None
    library: Optional[Library] = None
    reason: Optional[str] = None


_lock = threading.Lock()
_engines: dict[int, Engine] = {}  # id(communicator) -> its engine; read and written under _lock
_hooked: list[bool] = []  # the watchdog probe and join hooks are installed once per process


def library_file() -> str:
    """Return the path of the op's library for the MPI this process runs. Local (does not
    initialise MPI)."""
    from hpcrep.tensorflow.native import build  # noqa: PLC0415

    return build.library_path(build.running_mpi()[0])


def _unavailable_reason() -> Optional[str]:
    """Return why the compiled op cannot be used, or None if it can (does not load it)."""
    from hpcrep.tensorflow.native import build  # noqa: PLC0415

    flavour, version = build.running_mpi()
    library, stamp_file = build.library_path(flavour), build.stamp_path(flavour)
    if not os.path.exists(library) or not os.path.exists(stamp_file):
        return (f"it has not been built for this MPI ({version}); run `python -m "
                "hpcrep.tensorflow.native.build` with this Python (make install does for .venv, "
                "make ulfm for .venv-ulfm) with that MPI's C++ compiler (mpicxx) present")
    import tensorflow as tf  # noqa: PLC0415

    with open(stamp_file) as f:
        stamp = json.load(f)
    if stamp.get("tensorflow") != tf.__version__:
        return (f"it was built for TensorFlow {stamp.get('tensorflow')} but {tf.__version__} is "
                "running; rebuild with `python -m hpcrep.tensorflow.native.build`")
    if stamp.get("mpi") != flavour:
        return (f"{library} was built for MPI {stamp.get('mpi_version', stamp.get('mpi'))!r}, "
                f"not {version!r}; rebuild with `python -m hpcrep.tensorflow.native.build`")
    if stamp.get("source") != build.source_hash():
        return ("its sources changed since it was built; rebuild with "
                "`python -m hpcrep.tensorflow.native.build`")
    return None


@functools.lru_cache(maxsize=1)
def _load() -> Loaded:
    """Load the op library once, and check that it numbers reductions and errors as we do."""
    reason = _unavailable_reason()
    if reason is not None:
        return Loaded(reason=reason)
    import tensorflow as tf  # noqa: PLC0415

    path = library_file()
    try:
        ops = tf.load_op_library(path)
        library = Library(path)
    except Exception as error:  # noqa: BLE001 - a broken build must not break the Python path
        return Loaded(reason=f"it failed to load ({error}); rebuild it")
    mismatch = library.numbering_mismatch()
    if mismatch is not None:
        return Loaded(reason=f"{mismatch}; rebuild it with `python -m "
                             "hpcrep.tensorflow.native.build`")
    return Loaded(ops, library)


def _library() -> Library:
    library = _load().library
    assert library is not None, "the compiled op is used only when it loaded"
    return library


def status() -> tuple[bool, str]:
    """Return (whether allreduces take the compiled path, a sentence saying why). Local."""
    mode = config.get("HPCREP_NATIVE")
    if mode == "off":
        return False, "HPCREP_NATIVE=off: allreduces take the Python path"
    if ulfm.ft_enabled():
        # The communication thread's MPI calls do not recover from a failed rank; the Python
        # path's do (hpcrep.comm.recovery), so a fault-tolerant job takes that path.
        if mode == "on":
            raise ConfigError("HPCREP_NATIVE=on in a job started with fault tolerance on "
                              "(mpirun --with-ft ulfm): the compiled path does not recover from "
                              "a failed rank. Set HPCREP_NATIVE=auto (the Python path) or start "
                              "the job without --with-ft ulfm.")
        return False, ("the Python path is active: the job runs with fault tolerance on "
                       "(ULFM), which only the Python path's collectives recover from")
    reason = _load().reason
    if reason is None:
        return True, f"the compiled op ({library_file()}) is active"
    if mode == "on":
        raise ConfigError(f"HPCREP_NATIVE=on but the compiled op cannot be used: {reason}. "
                          "Build it, or set HPCREP_NATIVE=auto to fall back to the Python path.")
    return False, f"the Python path is active: the compiled op cannot be used: {reason}"


def active() -> bool:
    """Return True if allreduces take the compiled path (see :func:`status`). Local."""
    return status()[0]


def _find(communicator: Any) -> Optional[Engine]:
    with _lock:
        entry = _engines.get(id(communicator))
    return entry if entry is not None and entry.communicator is communicator else None


def engine(communicator: Any) -> int:
    """Return the id of ``communicator``'s communication thread, starting it on first use.

    The thread gets a duplicate of the communicator of its own, so its MPI calls never interleave
    with the Python path's. Collective on first use for a communicator: every member must call
    this in the same order (tracing the same function does); later calls are local.
    """
    found = _find(communicator)
    if found is not None:
        return found.engine_id
    from hpcrep.comm import collectives, stragglers, uneven, watchdog, world  # noqa: PLC0415

    with collectives.collective("native.register"):
        dup = communicator.comm.Dup()
    dup.Set_name(f"hpcrep native {communicator.name}")
    settings = EngineSettings(check=bool(config.get("HPCREP_CHECK_COLLECTIVES")),
                              fusion_bytes=int(config.get("HPCREP_FUSION_THRESHOLD")),
                              spin_micros=int(config.get("HPCREP_NATIVE_SPIN_US")),
                              polled=collectives.nonblocking(communicator),
                              match_timeout=float(config.get("HPCREP_MATCH_TIMEOUT")))
    started = Engine(communicator, _library().register(dup.handle, settings), dup, dup.Get_rank())
    with _lock:
        if not _engines:
            world.at_shutdown(shutdown)
        if not _hooked:
            _hooked.append(True)
            watchdog.add_probe(_busy)
            stragglers.add_source(_stragglers_seen)
            uneven.on_join(lambda: begin_join(world.communicator()),
                           lambda: end_join(world.communicator()),
                           lambda: active_cycles(world.communicator()))
        _engines[id(communicator)] = started
    key = id(communicator)
    communicator.at_free(lambda: _release(key))
    return started.engine_id


def _release(key: int) -> None:
    """Stop one communicator's thread and free its duplicate (collective over its members)."""
    with _lock:
        entry = _engines.pop(key, None)
    if entry is None:
        return
    _library().unregister(entry.engine_id)
    entry.dup.Free()


def shutdown() -> None:
    """Stop every communication thread and free their communicators.

    Collective: every rank must call this (:func:`hpcrep.comm.shutdown` does, before MPI ends),
    in registration order, which is the same on every rank.
    """
    with _lock:
        keys = sorted(_engines, key=lambda k: _engines[k].engine_id)
    for key in keys:
        _release(key)


@atexit.register
def _at_exit() -> None:
    # Threads must not be inside MPI when MPI finalises; what is queued has finished by now.
    with _lock:
        entries = list(_engines.values())
        _engines.clear()
    for entry in entries:
        _library().unregister(entry.engine_id)


def tune(communicator: Any, fusion_bytes: int, chunk_bytes: int, half_wire: bool = False) -> None:
    """Set the fusion threshold and piece size of ``communicator``'s requests traced as tuned
    (``tuned=True``: the gradient exchange under ``HPCREP_AUTOTUNE``), from their next request on;
    with ``half_wire``, their float32 buffers travel and are summed as float16.

    Local, but every rank must call it at the same point of its program (before the requests it
    is meant for are queued), or ranks would cut the same requests differently: see
    :mod:`hpcrep.tensorflow.autotune`. Starts the communicator's thread if it has none
    (collective then, as :func:`engine`).
    """
    _library().tune(engine(communicator), fusion_bytes, chunk_bytes, half_wire)


def begin_join(communicator: Any) -> None:
    """Let ``communicator``'s thread take part, with zeros, in allreduces the active ranks run.

    Called by :func:`hpcrep.comm.uneven.join` on every rank that joins. Local.
    """
    entry = _find(communicator)
    if entry is not None:
        _library().begin_join(entry.engine_id)


def end_join(communicator: Any) -> None:
    """Wait until the thread has seen every rank join (it leaves join mode with all of them).

    Local (the thread's cycles are what communicate). Every rank has joined by now, so this is
    quick; the stall watchdog watches it (``HPCREP_STALL_TIMEOUT``), so a thread that never
    leaves join mode aborts the job with a report instead of hanging it.
    """
    from hpcrep.comm import watchdog  # noqa: PLC0415

    entry = _find(communicator)
    if entry is None:
        return
    with watchdog.watching("join (the compiled path's thread leaving join mode)", ()):
        while _library().join_pending(entry.engine_id):
            time.sleep(0.001)


def active_cycles(communicator: Any) -> int:
    """Return the cycles ``communicator``'s thread ran with requests of this rank's own (not
    waiting in join); 0 without a thread. Local."""
    entry = _find(communicator)
    return 0 if entry is None else _library().active_cycles(entry.engine_id)


def _busy() -> Optional[tuple[str, tuple[str, ...], float]]:
    """The stall watchdog's view of the threads: what the longest wait is for, and since when."""
    with _lock:
        if not _engines:
            return None
    wait = _library().busy()
    if wait is None:
        return None
    since, what = wait
    return "allreduce (compiled path)", (what,), since


def _stragglers_seen() -> list[tuple[Any, int, int, list[tuple[int, float]]]]:
    """Who came last to each negotiation of every thread since the last call, per engine."""
    with _lock:
        engines = list(_engines.values())
    seen = []
    for entry in engines:
        size, observed = _library().stragglers(entry.engine_id)
        if observed:
            seen.append((("native", entry.engine_id), size, entry.rank, observed))
    return seen


def stats(communicator: Any) -> tuple[int, int]:
    """Return (cycles, requests) ``communicator``'s thread has reduced so far; (0, 0) if it has
    none. Fewer cycles than requests means requests were fused. Local."""
    entry = _find(communicator)
    return (0, 0) if entry is None else _library().stats(entry.engine_id)


def bits(value: float) -> int:
    """Return the 64 bits of a double as a signed integer (how scale factors reach the op)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def ops() -> Any:
    """Return the loaded op module (``hpcrep_allreduce_start``, ``hpcrep_allreduce_wait``,
    PowerSGD's ``hpcrep_powersgd_*``), or None where it does not load."""
    return _load().ops


def library_if_loaded() -> Optional[Library]:
    """Return the compiled library's C interface where it is built and loads (whatever
    ``HPCREP_NATIVE`` says: its event ring serves the timeline), else None. Local."""
    return _load().library


def host_status_op() -> Optional[Callable[..., Any]]:
    """Return the op that raises a host call's error with its own TensorFlow error code
    (``hpcrep_check_host_status``; see :func:`hpcrep.tensorflow.bridge.host_call`), or None
    where the library cannot be loaded. Independent of ``HPCREP_NATIVE``. Local."""
    loaded = _load()
    return None if loaded.ops is None else loaded.ops.hpcrep_check_host_status
