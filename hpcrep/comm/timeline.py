"""The timeline's recorder: what this rank did, when, on its own steady clock.

Python-side recording for ``HPCREP_TIMELINE`` / ``hvd.start_timeline`` (numpy and the standard
library only; :mod:`hpcrep.comm.timeline_file` starts, stops, aligns the ranks' clocks and
writes the merged trace). While the recorder is on, three kinds of record are kept in memory:

- a *collective* (:func:`collective`): one call of :mod:`hpcrep.comm` (allreduce, broadcast,
  allgather, ...), from entry to return, with its kind, tensor names and bytes;
- its *phases* (:func:`phase`): ``negotiate`` (agreeing with the other ranks on what runs, which
  is where a rank waits for the others), ``pack``, ``mpi``, ``unpack``; each lies inside its
  collective and names it (``args["collective"]``);
- *steps* (:func:`step_begin` / :func:`step_end`): training step boundaries from Keras's ``fit``
  (a callback), the Replicator, and ``DistributedOptimizer.apply`` /
  ``DistributedGradientTape.gradient`` (:mod:`hpcrep.tensorflow.timeline` marks them), or from
  a loop of the caller's around each call of its compiled step (source ``"loop"``).

Other recorders (the compiled engine's ring, :mod:`hpcrep.tensorflow.native.timeline`) register
as *sources* (:func:`add_source`): turned on and off with this recorder and drained at each step
boundary, so their fixed-size buffers never overflow within a step window.

A record is a plain tuple ``(name, cat, lane, start_ns, end_ns, args)`` with times from
:func:`time.monotonic_ns` (CLOCK_MONOTONIC, the compiled engine's ``steady_clock``); ``lane`` is
a string (``"python <thread name>"``, ``"engine"``, ...). When the recorder is off every hook
returns at once: one global read, nothing allocated.

Steps: several places may mark them (``fit``'s callback, then ``apply`` inside the same step);
the most specific source seen so far owns the step counter (:data:`SOURCES`, first wins), the
others are recorded as instants. Steps count from 0; a step window ``(A, B)`` keeps the records
of steps A to B inclusive (those before the first step count as step 0's).

Everything here is local: no function communicates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from typing import Any, Iterator, Optional, Protocol, Sequence

Record = tuple[str, str, str, int, int, dict]

# Sources of step boundaries, most specific first: one that has been seen owns the counter.
# "loop": a caller's own loop marking each call of an already compiled step (bench.exposed).
SOURCES = ("loop", "fit", "replicator", "apply", "gradient")

_NULL = contextlib.nullcontext()
_on = False  # recording now (started and inside the step window): the hot path's one read


class Source(Protocol):
    """A recorder outside Python (the compiled engine's ring) that follows this one."""

    def enable(self, on: bool, mark_cycles: bool) -> None:
        """Record from now on (or stop recording)."""

    def drain(self) -> list[Record]:
        """Return the records made since the last drain, as this module's tuples."""


@dataclasses.dataclass
class _State:
    started: bool = False
    mark_cycles: bool = False
    window: Optional[tuple[int, Optional[int]]] = None
    records: list = dataclasses.field(default_factory=list)
    sources: list = dataclasses.field(default_factory=list)
    step: int = 0
    step_start: int = 0
    in_step: bool = False
    owner: Optional[str] = None
    dropped: int = 0  # minus the sources' lost records at start


_state = _State()
_lock = threading.Lock()
_ids = itertools.count(1)
_local = threading.local()


def on() -> bool:
    """Return True while records are being kept (started, inside the step window)."""
    return _on


def started() -> bool:
    """Return True between :func:`start` and :func:`stop` (also outside the step window)."""
    return _state.started


def add_source(source: Source) -> None:
    """Follow this recorder with ``source`` (turned on and off with it, drained at step ends)."""
    with _lock:
        if source not in _state.sources:
            _state.sources.append(source)
    if _state.started:
        source.enable(_on, _state.mark_cycles)


def remove_source(source: Source) -> None:
    """Stop following this recorder with ``source`` (switching it off)."""
    with _lock:
        if source in _state.sources:
            _state.sources.remove(source)
    source.enable(False, False)


def start(window: Optional[tuple[int, Optional[int]]] = None, mark_cycles: bool = False) -> None:
    """Start keeping records (forgetting earlier ones).

    Args:
        window: ``(A, B)``: keep only steps A to B inclusive (B None: to the end); None: all.
        mark_cycles: also record each cycle of the compiled engine (Horovod's option).
    """
    with _lock:
        _state.started, _state.mark_cycles, _state.window = True, mark_cycles, window
        _state.records, _state.step, _state.in_step, _state.owner = [], 0, False, None
        _state.step_start = time.monotonic_ns()
        _state.dropped = -sum(getattr(s, "dropped", 0) for s in _state.sources)
    _update()
    for source in list(_state.sources):
        source.enable(_on, mark_cycles)


def stop() -> tuple[list[Record], int]:
    """Stop recording; return every record kept since :func:`start` and how many of the
    sources' records were lost (their buffers overflowed between drains)."""
    global _on
    _drain()
    with _lock:
        _on = False
        _state.started = False
        records, _state.records = _state.records, []
    for source in list(_state.sources):
        source.enable(False, False)
    return records, _state.dropped + sum(getattr(s, "dropped", 0) for s in _state.sources)


def _in_window(step: int) -> bool:
    window = _state.window
    return window is None or (window[0] <= step and (window[1] is None or step <= window[1]))


def _update() -> None:
    global _on
    now = _state.started and _in_window(_state.step)
    if now != _on:
        _on = now
        for source in list(_state.sources):
            source.enable(now, _state.mark_cycles)


def _drain() -> None:
    for source in list(_state.sources):
        got = source.drain()
        with _lock:
            _state.records.extend(got)


def lane() -> str:
    """Return the lane of the calling thread: ``"python <thread name>"``."""
    return f"python {threading.current_thread().name}"


def add(name: str, cat: str, start_ns: int, end_ns: int, args: Optional[dict] = None,
        lane_name: Optional[str] = None) -> None:
    """Keep one record (if recording) of an interval measured by the caller."""
    if _on:
        _state.records.append((name, cat, lane_name or lane(), start_ns, end_ns, args or {}))


class _Span:
    """An interval being recorded: its args may grow until it ends."""

    __slots__ = ("name", "cat", "args", "start")

    def __init__(self, name: str, cat: str, args: dict) -> None:
        self.name, self.cat, self.args = name, cat, args
        self.start = time.monotonic_ns()

    def end(self) -> None:
        # Kept whole even if the window closed meanwhile: its phases are kept too.
        if _state.started:
            _state.records.append((self.name, self.cat, lane(), self.start, time.monotonic_ns(),
                                   self.args))


@contextlib.contextmanager
def _collective(kind: str, names: Sequence[str]) -> Iterator[_Span]:
    span = _Span(kind, "collective", {"id": next(_ids), "kind": kind,
                                      "tensors": list(names[:8]), "count": len(names),
                                      "bytes": 0, "path": "python"})
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(span)
    try:
        yield span
    finally:
        stack.pop()
        span.end()


def collective(kind: str, names: Sequence[str] = ()) -> Any:
    """Record one collective call (a context manager; a shared no-op when not recording)."""
    if not _on:
        return _NULL
    return _collective(kind, tuple(names))


@contextlib.contextmanager
def _phase(name: str, parent: _Span, nbytes: int, args: dict) -> Iterator[None]:
    start = time.monotonic_ns()
    try:
        yield
    finally:
        if nbytes and name == "mpi":
            parent.args["bytes"] += nbytes
        if _state.started:  # as its collective: kept whole
            _state.records.append((name, "phase", lane(), start, time.monotonic_ns(),
                                   {"collective": parent.args["id"], "bytes": nbytes, **args}))


def phase(name: str, nbytes: int = 0, **args: Any) -> Any:
    """Record one phase (``negotiate``, ``pack``, ``mpi``, ``unpack``) of the collective this
    thread is in (a context manager; a no-op when not recording or outside a collective).
    ``nbytes`` of ``mpi`` phases add up to the collective's bytes."""
    if not _on:
        return _NULL
    stack = getattr(_local, "stack", None)
    if not stack:
        return _NULL
    return _phase(name, stack[-1], nbytes, args)


def _rank(source: str) -> int:
    return SOURCES.index(source) if source in SOURCES else len(SOURCES)


def _owns(source: str) -> bool:
    if _state.owner is None or _rank(source) < _rank(_state.owner):
        _state.owner = source
    return source == _state.owner


def step_begin(source: str) -> None:
    """A training step starts now (``source``: one of :data:`SOURCES`)."""
    if not _state.started:
        return
    if not _owns(source):
        add(f"{source} begins", "mark", time.monotonic_ns(), time.monotonic_ns(),
            {"source": source}, "steps")
        return
    _state.in_step = True
    _state.step_start = time.monotonic_ns()


def step_end(source: str) -> None:
    """A training step ends now: record it (if in the window), drain the sources, count it."""
    if not _state.started:
        return
    now = time.monotonic_ns()
    if not _owns(source):
        add(f"{source} ends", "mark", now, now, {"source": source}, "steps")
        return
    add(f"step {_state.step}", "step", _state.step_start, now,
        {"step": _state.step, "source": source}, "steps")
    _drain()
    _state.step += 1
    _state.in_step = False
    _state.step_start = now
    _update()


def current_step() -> int:
    """Return the number of the step now running (or next to run), counted from 0."""
    return _state.step


def mark(name: str, args: Optional[dict] = None) -> None:
    """Record an instant (zero-length record) on the ``steps`` lane."""
    now = time.monotonic_ns()
    add(name, "mark", now, now, args, "steps")

