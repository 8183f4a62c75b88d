"""Live straggler detection: a rank that arrives last at most collectives is named, once.

The agreement before each collective of the Python path (:func:`hpcrep.comm.uneven.agree`, one
small MAX allreduce) is itself a meeting point: the rank that arrives last waits least in it, and
the first waits about as long as the last was late. So each agreement also carries, from every
rank, how long it waited in the previous one, encoded (:func:`encode`) so that the MAX yields
the rank that waited least together with its wait, and the longest wait. Every rank then knows,
for each agreement, which rank came last and by how much (the longest wait less the shortest),
at the cost of two more int64s in a message that is sent anyway.

The compiled allreduce path's negotiation (hpcrep/tensorflow/native/negotiate.cc) carries the
same two entries; :func:`add_source` polls what it saw once a second.

Over the last ``HPCREP_STRAGGLER_WINDOW`` agreements on a communicator that spans the job, a rank
that came last in at least ``HPCREP_STRAGGLER_SHARE`` of them, by a median of at least
``HPCREP_STRAGGLER_MIN_LATE`` seconds, is named on stderr by rank 0, once per rank. By chance
each of n ranks comes last 1/n of the time, and with a lateness of scheduling noise; the defaults
(100 agreements, 0.9, 20 ms) stay quiet on a healthy node and name a rank that is consistently
tens of milliseconds behind (a slow node, a slower link, extra work on that rank).
"""

from __future__ import annotations

import collections
import statistics
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from hpcrep import config

_WAIT_BITS = 40                   # microseconds: up to 12 days
_RANK_BITS = 20                   # ranks: up to about a million
_WAIT_MAX = (1 << _WAIT_BITS) - 1
NONE = -(1 << 63)                 # neutral for MAX: nothing to report (the first agreement)


def encode(wait_s: float, rank: int) -> tuple[int, int]:
    """Return the two control entries of a rank that waited ``wait_s`` seconds: the MAX of the
    first over ranks names the rank that waited least (ties: the highest rank) and its wait,
    the MAX of the second is the longest wait, in microseconds."""
    wait_us = min(_WAIT_MAX, max(0, int(wait_s * 1e6)))
    return ((_WAIT_MAX - wait_us) << _RANK_BITS) | int(rank), wait_us


def decode(least: int, longest: int) -> Optional[tuple[int, float]]:
    """Return ``(last rank, seconds it was late)`` from the reduced entries, or None if no rank
    sent any (every rank's first agreement)."""
    if least == NONE or longest == NONE:
        return None
    rank = least & ((1 << _RANK_BITS) - 1)
    shortest_us = _WAIT_MAX - (least >> _RANK_BITS)
    return rank, max(0, longest - shortest_us) * 1e-6


class Tracker:
    """The last ``window`` agreements' (last rank, lateness); names a rank once it qualifies."""

    def __init__(self, window: int, share: float, min_late: float) -> None:
        self.window, self.share, self.min_late = window, share, min_late
        self.seen: collections.deque = collections.deque(maxlen=max(1, window))
        self.named: set[int] = set()

    def observe(self, last: int, late: float, hosts: Sequence[str] = ()) -> Optional[str]:
        """Add one agreement; return the warning the first time ``last`` qualifies, else None."""
        self.seen.append((last, late))
        if self.window <= 0 or len(self.seen) < self.window or last in self.named:
            return None
        lates = [d for r, d in self.seen if r == last]
        if len(lates) < self.share * self.window:
            return None
        median = statistics.median(lates)
        if median < self.min_late:
            return None
        self.named.add(last)
        host = f" on {hosts[last]}" if last < len(hosts) else ""
        return (f"hpcrep: straggler: rank {last}{host} arrived last at {len(lates)} of the last "
                f"{self.window} collectives, {1e3 * median:.0f} ms after the first rank (median "
                "of those); every rank waits for it. Look at that node (load, its link, "
                "throttling) or that rank's share of the work (HPCREP_STRAGGLER_WINDOW=0 turns "
                "this check off).")


_trackers: dict[Any, Tracker] = {}
_last_wait: dict[int, float] = {}


def tracker(key: Any) -> Tracker:
    """The tracker of one communicator (made with the current settings on first use). Local."""
    if key not in _trackers:
        _trackers[key] = Tracker(int(config.get("HPCREP_STRAGGLER_WINDOW")),
                                 float(config.get("HPCREP_STRAGGLER_SHARE")),
                                 float(config.get("HPCREP_STRAGGLER_MIN_LATE")))
    return _trackers[key]


def entries(comm: Any) -> tuple[int, int]:
    """This rank's two control entries for its next agreement on ``comm``. Local."""
    wait = _last_wait.get(id(comm))
    return (NONE, NONE) if wait is None else encode(wait, comm.Get_rank())


def after(comm: Any, least: int, longest: int, waited: float, world_size: int,
          hosts: Sequence[str] = ()) -> None:
    """Record this agreement: remember how long this rank ``waited`` in it, and, on a
    communicator of ``world_size`` ranks, feed the previous agreement's last rank to its
    tracker; rank 0 prints a warning the tracker returns. Local (uses the reduced entries)."""
    _last_wait[id(comm)] = waited
    found = decode(least, longest)
    if found is not None:
        report(id(comm), comm.Get_size(), comm.Get_rank(), [found], world_size, hosts)


def report(key: Any, size: int, rank: int, seen: Sequence[tuple[int, float]],
           world_size: int, hosts: Sequence[str] = ()) -> None:
    """Feed ``seen`` ((last rank, seconds late) per agreement, oldest first) of a communicator
    of ``size`` ranks, in which this rank is ``rank``, to the tracker of ``key``; rank 0
    prints a warning. Only communicators that span the job count. Local."""
    if size != world_size or world_size < 2:
        return
    track = tracker(key)
    for last, late in seen:
        warning = track.observe(last, late, hosts)
        if warning and rank == 0:
            print(warning, file=sys.stderr, flush=True)


_sources: list[Callable[[], Iterable[tuple[Any, int, int, Sequence[tuple[int, float]]]]]] = []
_poller: list[threading.Thread] = []


def add_source(source: Callable[[], Iterable[tuple[Any, int, int,
                                                     Sequence[tuple[int, float]]]]]) -> None:
    """Poll ``source()`` once a second from a daemon thread: it returns ``(key, size, rank,
    seen)`` per communicator, as :func:`report` takes them (the compiled path's negotiations,
    which carry the same two entries). Local."""
    _sources.append(source)
    if not _poller:
        thread = threading.Thread(target=_poll, name="hpcrep-stragglers", daemon=True)
        _poller.append(thread)
        thread.start()


def _poll() -> None:
    from hpcrep.comm import watchdog  # noqa: PLC0415

    while True:
        time.sleep(1.0)
        hosts = watchdog.hosts()
        for source in list(_sources):
            try:
                for key, size, rank, seen in source():
                    report(key, size, rank, seen, len(hosts), hosts)
            except Exception as e:  # noqa: BLE001 - a diagnostic must never end the job
                print(f"hpcrep: straggler check stopped: {e}", file=sys.stderr, flush=True)
                _sources.remove(source)


def forget(comm: Any) -> None:
    """Drop what is kept for ``comm`` (when it is freed). Local."""
    _trackers.pop(id(comm), None)
    _last_wait.pop(id(comm), None)
