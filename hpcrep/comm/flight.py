"""Flight recorder: each rank's last collectives, written out when the job fails.

Every collective of :mod:`hpcrep.comm` (and so of the Python allreduce path of
:mod:`hpcrep.tensorflow`) is recorded, while it runs, in a ring of the last
``HPCREP_FLIGHT_RECORDER`` entries: the collective, its tensors' names, dtypes and shapes, this
rank's call number, the ranks of its communicator, the line of user code that issued it (the
first frame outside hpcrep), the thread, and its start and end times. The cost is one small
record per collective: 15-40 microseconds for a call of 8 tensors on this project's 2-core VM
(``HPCREP_FLIGHT_RECORDER=0``: 6), against 100 or more for the smallest hpcrep collective.

The ring is written to one directory of the job's in the working directory,
``hpcrep-flight-<job>/rank<r>.json`` (with ``HPCREP_FLIGHT_DIR``: to
``hpcrep-flight-<job>-rank<r>.json`` there), with a summary on stderr, when

- the stall watchdog warns (every waiting rank writes its file, before any rank aborts) and
  aborts (the file again, and the summary: the first call at which the ranks' histories differ
  and the ranks that never answered; :mod:`hpcrep.comm.watchdog` sends each rank's recent
  history with its status);
- the mismatch check fails (:func:`mismatch`: every rank of the communicator writes its file,
  its lowest rank prints the summary);
- the job is aborted (:func:`hpcrep.comm.abort.abort`, an unhandled exception under
  ``python -m hpcrep``).

Histories are compared by call number, collective and dtypes/shapes, not by tensor names (ranks
may name the same tensor differently, as the mismatch check allows). ``HPCREP_FLIGHT_RECORDER=0``
turns the recorder off.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

from hpcrep import config

_NAMES_KEPT = 8       # names and shapes kept per entry (the count says how many there were)
HISTORY_SENT = 32     # entries of history a rank sends with its status (watchdog, mismatch)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the hpcrep package


@dataclasses.dataclass
class Entry:
    """One collective as this rank saw it."""

    call: int                      # this rank's call number (1 = its first collective)
    kind: str
    names: tuple[str, ...]
    count: int                     # tensors in the call (names/layout keep the first few)
    layout: tuple                  # (dtype, shape) per kept tensor, formatted only when shown
    group: str                     # 'world' or the ranks of the communicator
    frame: str                     # 'path/to/script.py:42 in train_step'
    thread: str
    start: float                   # time.time()
    end: Optional[float] = None    # None: still in the collective

    @property
    def shapes(self) -> tuple[str, ...]:
        """'float32[3, 4]' per kept tensor."""
        return tuple(_shape(dtype, shape) for dtype, shape in self.layout)

    def signature(self) -> tuple:
        """What must be equal on every rank at this call number (names may differ)."""
        return (self.kind, self.count, self.shapes)

    def as_dict(self) -> dict:
        fields = dataclasses.asdict(self)
        del fields["layout"]
        return {**fields, "shapes": list(self.shapes)}

    def brief(self) -> str:
        shown = ", ".join(repr(n) for n in self.names[:2])
        more = f" and {self.count - 2} more" if self.count > 2 else ""
        return f"{self.kind} of {shown or 'no tensors'}{more}"


@dataclasses.dataclass
class _State:
    ring: Optional[collections.deque] = None
    calls: int = 0
    owner: Optional[int] = None     # thread inside the outermost recorded collective
    dumped: Optional[str] = None    # why the ring was written last (see on_abort)
    base: int = 0                   # call number of the last mismatch reported (see history)


_state = _State()
_lock = threading.Lock()


def capacity() -> int:
    """``HPCREP_FLIGHT_RECORDER``: entries kept per rank (0: off)."""
    return max(0, int(config.get("HPCREP_FLIGHT_RECORDER")))


def _ring() -> Optional[collections.deque]:
    size = capacity()
    if size == 0:
        return None
    if _state.ring is None or _state.ring.maxlen != size:
        _state.ring = collections.deque(_state.ring or (), maxlen=size)
    return _state.ring


def _layout(a: Any) -> tuple:
    return (getattr(a, "dtype", None) or type(a).__name__, getattr(a, "shape", None))


def _shape(dtype: Any, shape: Any) -> str:
    name = getattr(dtype, "name", dtype)
    return str(name) if shape is None else f"{name}[{', '.join(str(d) for d in shape)}]"


def _user_frame() -> str:
    """The innermost frame outside hpcrep, contextlib and threading: who issued the call."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_HERE) or path.endswith(("contextlib.py", "threading.py"))):
            return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@contextlib.contextmanager
def recording(kind: str, names: Sequence[str] = (), arrays: Sequence[Any] = (),
              group: str = "world") -> Iterator[None]:
    """Record the collective run inside the block (nested calls on one thread count once).

    Local.
    """
    ring = _ring()
    me = threading.get_ident()
    if ring is None or _state.owner == me:
        yield
        return
    with _lock:
        _state.calls += 1
        entry = Entry(_state.calls, kind, tuple(names[:_NAMES_KEPT]), max(len(names), len(arrays)),
                      tuple(_layout(a) for a in arrays[:_NAMES_KEPT]), group, _user_frame(),
                      threading.current_thread().name, time.time())
        ring.append(entry)
    _state.owner = me
    try:
        yield
    finally:
        _state.owner = None
        entry.end = time.time()


def entries() -> list[Entry]:
    """This rank's recorded collectives, oldest first. Local."""
    with _lock:
        return list(_state.ring or ())


def history(limit: int = HISTORY_SENT) -> tuple:
    """The last ``limit`` entries as ``(call, signature, brief)`` tuples, small enough to send.

    Calls are numbered from the last mismatch this rank reported (:func:`mismatch`), after
    which the ranks are in step again (every rank raised at the same collective), so a job that
    caught a mismatch and went on is compared from there; without one, from the first call.
    """
    base = _state.base
    return tuple((e.call - base, e.signature(), e.brief()) for e in entries()[-limit:]
                 if e.call > base)


def first_divergence(histories: dict[int, Sequence[tuple]]) -> Optional[tuple[int, dict]]:
    """Return ``(call, {rank: brief})`` for the first call number at which ranks' histories differ
    (by signature, or because some ranks recorded that call and others have not reached it), or
    None when they agree on every call they all hold. ``histories`` maps rank to :func:`history`.
    """
    by_rank = {r: {call: (sig, brief) for call, sig, brief in h} for r, h in histories.items()}
    if len(by_rank) < 2:
        return None
    held = [set(calls) for calls in by_rank.values() if calls]
    if not held:
        return None
    # Compare from the oldest call every rank can still show (rings forget the oldest).
    start = max(min(calls) for calls in held)
    last = max(max(calls) for calls in held)
    for call in range(start, last + 1):
        seen = {r: calls.get(call) for r, calls in by_rank.items()}
        if len({None if v is None else repr(v[0]) for v in seen.values()}) > 1:
            return call, {r: (v[1] if v is not None else "nothing yet (its last call: "
                              f"#{max(by_rank[r]) if by_rank[r] else 0})")
                          for r, v in seen.items()}
    return None


def divergence_text(histories: dict[int, Sequence[tuple]], hosts: Sequence[str] = ()) -> str:
    """One line: where the histories first differ, ranks grouped by what they did there."""
    found = first_divergence(histories)
    if found is None:
        calls = [max((c for c, _, _ in h), default=0) for h in histories.values()]
        return (f"the histories of ranks {_list(sorted(histories))} agree "
                f"(last call #{max(calls, default=0)})")
    call, what = found
    groups: dict[str, list[int]] = {}
    for r, brief in sorted(what.items()):
        groups.setdefault(brief, []).append(r)
    parts = [f"{_ranks(rs, hosts)}: {brief}" for brief, rs in groups.items()]
    return f"the histories first differ at call #{call}: " + "; ".join(parts)


def _list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def _ranks(ranks: Sequence[int], hosts: Sequence[str]) -> str:
    label = "rank" if len(ranks) == 1 else "ranks"
    where = {hosts[r] for r in ranks if r < len(hosts)}
    return f"{label} {_list(ranks)}" + (f" on {', '.join(sorted(where))}" if where else "")


def dump_path(rank: int) -> str:
    """Where rank ``rank`` writes its ring: ``HPCREP_FLIGHT_DIR/hpcrep-flight-<job>-rank<r>.json``,
    or without that setting one directory of the job's in the working directory,
    ``hpcrep-flight-<job>/rank<r>.json``."""
    job = (os.environ.get("SLURM_JOB_ID") or os.environ.get("PMIX_NAMESPACE")
           or os.environ.get("OMPI_MCA_orte_ess_jobid") or "job")
    job = re.sub(r"[^A-Za-z0-9_.-]+", "_", job)
    directory = config.get("HPCREP_FLIGHT_DIR")
    if directory:
        return os.path.join(directory, f"hpcrep-flight-{job}-rank{rank}.json")
    return os.path.join(os.getcwd(), f"hpcrep-flight-{job}", f"rank{rank}.json")


def dump(rank: int, reason: str, in_flight: Optional[dict] = None) -> Optional[str]:
    """Write this rank's ring (and what it waits in, if known) to :func:`dump_path`; return the
    path, or None when the recorder is off or the file cannot be written (the reason is printed:
    a failing job must still end). Atomic: written to a temporary name, then renamed. Local.
    """
    if capacity() == 0:
        return None
    path = dump_path(rank)
    record = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
              "written": time.time(), "in_flight": in_flight,
              "entries": [e.as_dict() for e in entries()]}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        print(f"hpcrep: rank {rank}: could not write the flight recorder to {path}: {e}",
              file=sys.stderr, flush=True)
        return None
    _state.dumped = reason
    return path


def last_lines(limit: int = 3) -> list[str]:
    """This rank's last ``limit`` collectives, one line each, newest last."""
    now = time.time()
    lines = []
    for e in entries()[-limit:]:
        state = (f"took {1e3 * (e.end - e.start):.1f} ms" if e.end is not None
                 else f"not returned after {now - e.start:.1f} s")
        shapes = ", ".join(e.shapes[:2]) + (", ..." if e.count > 2 else "")
        where = f"{shapes}; {e.group}" if shapes else e.group
        lines.append(f"    #{e.call} {e.brief()} ({where}) from {e.frame}: {state}")
    return lines


def mismatch(comm: Any) -> None:
    """After a failed mismatch check: gather every rank's recent history over ``comm``, write
    this rank's file, and have the lowest rank print the summary on stderr.

    Collective: every rank of ``comm`` must call this (all ranks see the check fail alike).
    """
    mine = history() if capacity() else ()
    everyone = comm.allgather(mine)
    _state.base = _state.calls  # compare later histories from here (see history)
    me = comm.Get_rank()
    path = dump(me, "collective mismatch")
    if me != 0 or path is None:
        return
    text = divergence_text({r: h for r, h in enumerate(everyone)})
    print(f"hpcrep: flight recorder (collective mismatch): {text}. Each rank's last "
          f"{capacity()} collectives: {dump_path(0).replace('rank0', 'rank<r>')}",
          file=sys.stderr, flush=True)


def on_abort(rank: int) -> None:
    """Write this rank's ring before the job is aborted, unless the stall watchdog, which is
    aborting it, has just done so with its own summary; print where. Local."""
    if capacity() == 0 or _state.dumped == "stall abort":
        return
    path = dump(rank, "job abort")
    if path is not None:
        lines = "\n".join(last_lines())
        print(f"hpcrep: rank {rank}: flight recorder: last collectives here:\n{lines}\n"
              f"  all {len(entries())} in {path}", file=sys.stderr, flush=True)
