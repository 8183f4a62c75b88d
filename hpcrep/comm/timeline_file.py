"""The merged timeline: one clock for every rank, and one Chrome-trace file written by rank 0.

:func:`start` measures each rank's clock offset to rank 0 (a few ping-pongs with rank 0, the
median of ``their clock - the midpoint of rank 0's send and receive``) and starts the recorder
(:mod:`hpcrep.comm.timeline`); :func:`stop` gathers every rank's records on rank 0, which
writes ``{"traceEvents": [...]}`` (the Chrome trace format that ``chrome://tracing`` and
Perfetto read):

- one ``pid`` per rank, named ``rank R (host)`` by a ``"ph": "M"`` ``process_name`` record; one
  ``tid`` per lane (the compiled engine's thread, its allreduce requests, each Python thread that
  ran a collective, the steps), named by ``thread_name`` records;
- every record a complete event (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds on rank
  0's clock (from the earliest record), ``cat`` one of ``collective``, ``phase``, ``step``,
  ``engine``, ``mark``, and what it moved in ``args`` (tensor names, bytes, fusion bucket and the
  tensors that shared it).

``HPCREP_TIMELINE=FILE`` starts it at ``init`` and stops it at ``shutdown`` or at exit;
``HPCREP_TIMELINE_STEPS=A:B`` keeps only steps A to B. ``hpcrep analyze FILE`` reads the file.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import statistics
import time
from typing import Any, Optional

from hpcrep import config
from hpcrep.comm import collectives, timeline, world
from hpcrep.errors import ConfigError

PING_PONGS = 7      # rounds per rank; the median offset is kept
_TAG = 7352         # tag of the ping-pong messages on hpcrep's private communicator

_path: list[str] = []      # the file being recorded for (empty: not started)
_offset_ns: list[int] = []  # this rank's clock minus rank 0's (measured at start)


def clock_offsets(comm: Any) -> list[int]:
    """Return every rank's steady-clock offset to rank 0 in ns, on rank 0 (others: their own
    offset alone, in a one-element list).

    Rank 0 plays ``PING_PONGS`` rounds with each rank in turn: it sends, the rank answers with
    its clock, rank 0 takes ``their clock - (sent + received) / 2`` and keeps the median.

    Collective: every rank of ``comm`` must call this.
    """
    import numpy as np  # noqa: PLC0415

    me, n = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(1, dtype=np.int64)
    if me == 0:
        offsets = [0]
        for r in range(1, n):
            samples = []
            for _ in range(PING_PONGS):
                sent = time.monotonic_ns()
                comm.Send(buf, dest=r, tag=_TAG)
                comm.Recv(buf, source=r, tag=_TAG)
                received = time.monotonic_ns()
                samples.append(int(buf[0]) - (sent + received) // 2)
            offsets.append(int(statistics.median(samples)))
        comm.Scatter(np.array(offsets, dtype=np.int64), buf, root=0)
        return offsets
    for _ in range(PING_PONGS):
        comm.Recv(buf, source=0, tag=_TAG)
        buf[0] = time.monotonic_ns()
        comm.Send(buf, dest=0, tag=_TAG)
    comm.Scatter(None, buf, root=0)
    return [int(buf[0])]


def start(path: str, mark_cycles: bool = False,
          window: Optional[tuple[int, Optional[int]]] = None) -> None:
    """Start recording the timeline for ``path`` (written by rank 0 at :func:`stop`).

    A start while one runs writes that one first. Collective: every rank must call this (the
    clock offsets are measured here).
    """
    if not path:
        raise ConfigError("start_timeline needs a file path (the merged trace rank 0 writes)")
    stop()  # one running already: write it first
    with collectives.collective("timeline.start"):
        comm = world.comm()
        offsets = clock_offsets(comm)
    _offset_ns[:] = [offsets[0] if comm.Get_rank() else 0]
    _path[:] = [path]
    timeline.start(window, mark_cycles)
    world.at_shutdown(_stop_at_shutdown)


def stop() -> Optional[str]:
    """Stop recording; rank 0 writes the merged trace. Returns the path on rank 0, else None.

    Collective: every rank that started the timeline must call this (``hvd.shutdown()`` and the
    end of the program do).
    """
    if not _path:
        return None
    path = _path.pop()
    records, dropped = timeline.stop()
    mine = {"host": platform.node(), "offset_ns": _offset_ns[0] if _offset_ns else 0,
            "records": records, "dropped": dropped}
    with collectives.collective("timeline.stop"):
        comm = world.comm()
        everyone = comm.gather(mine, root=0)
    if everyone is None:
        return None
    write(path, everyone)
    return path


def _stop_at_shutdown() -> None:
    stop()


@atexit.register
def _at_exit() -> None:
    if _path and world.is_initialized():
        stop()


def chrome_events(per_rank: list[dict]) -> list[dict]:
    """Return the Chrome-trace events of every rank's records (``per_rank[r]``: ``host``,
    ``offset_ns``, ``records``), on rank 0's clock, in microseconds from the earliest record.
    Pure."""
    starts = [rec[3] - info["offset_ns"] for info in per_rank for rec in info["records"]]
    origin = min(starts) if starts else 0
    events: list[dict] = []
    for rank, info in enumerate(per_rank):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank} ({info['host']})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        lanes: dict[str, int] = {}
        for name, cat, lane, start_ns, end_ns, args in sorted(info["records"],
                                                              key=lambda r: (r[3], -r[4])):
            if lane not in lanes:
                lanes[lane] = len(lanes) + 1
                events.append({"name": "thread_name", "ph": "M", "pid": rank,
                               "tid": lanes[lane], "args": {"name": lane}})
            events.append({"name": name, "cat": cat, "ph": "X", "pid": rank, "tid": lanes[lane],
                           "ts": (start_ns - info["offset_ns"] - origin) / 1e3,
                           "dur": max(0, end_ns - start_ns) / 1e3, "args": _plain(args)})
    return events


def _plain(args: dict) -> dict:
    """JSON-safe copies of record args (numpy scalars become numbers)."""
    out = {}
    for key, value in args.items():
        if hasattr(value, "item"):
            value = value.item()
        elif isinstance(value, (tuple, set)):
            value = list(value)
        out[key] = value
    return out


def write(path: str, per_rank: list[dict]) -> None:
    """Write the merged trace of ``per_rank`` (see :func:`chrome_events`) to ``path``
    atomically. Local (rank 0 calls it)."""
    dropped = sum(info.get("dropped", 0) for info in per_rank)
    trace = {"traceEvents": chrome_events(per_rank), "displayTimeUnit": "ms",
             "otherData": {"hpcrep": "timeline", "ranks": len(per_rank),
                           "offsets_us": [info["offset_ns"] / 1e3 for info in per_rank],
                           "dropped": dropped}}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)


def start_from_settings() -> bool:
    """Start the timeline if ``HPCREP_TIMELINE`` names a file (``HPCREP_TIMELINE_STEPS`` its
    window); return whether it did. Collective, like :func:`start` (``init`` calls it)."""
    path = config.get("HPCREP_TIMELINE")
    if not path or _path:
        return False
    start(path, mark_cycles=bool(config.get("HPCREP_TIMELINE_MARK_CYCLES")),
          window=config.get("HPCREP_TIMELINE_STEPS"))
    return True

