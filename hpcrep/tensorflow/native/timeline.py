"""The compiled engine's event ring, read for the timeline (see ``timeline.h``).

:class:`RingSource` follows :mod:`hpcrep.comm.timeline` (a *source* of it): it turns the ring's
stamping on and off with the recorder and, when drained, turns each allreduce request's record
into the recorder's tuples:

- a ``collective`` on the lane ``compiled allreduce K`` (requests overlap in time, so each is
  put on the first such lane free at its start), from the Start kernel to the result's return
  to TensorFlow, with its tensors, bytes, fusion group and the requests that shared its buffer;
- its phases, each inside it: ``pack`` (the Start kernel copies the inputs into the request's
  buffer), ``queued`` (waiting for the engine's next cycle), ``negotiate`` (the cycle agrees with
  the other ranks: where a rank waits for the slowest), ``fuse`` (copy into the shared fusion
  buffer), ``mpi``, ``unpack`` (copy out and scaling), ``returned`` (handing the result back);
- on the ``engine`` lane, what the communication thread did: one ``negotiate`` per cycle and one
  ``allreduce`` per fusion group (and a ``cycle`` per cycle with ``mark_cycles``).

Local: nothing here communicates.
"""

from __future__ import annotations

import ctypes
from typing import Optional

from hpcrep.comm.timeline import Record
from hpcrep.tensorflow.native.library import Library

STAMPS = ("op_start", "enqueued", "negotiate_start", "negotiate_end", "fuse_start", "mpi_start",
          "mpi_end", "unpack_end", "finished", "returned")
_REQUEST, _CYCLE = 1, 2
# (phase, from stamp, to stamp) of a request, in order
PHASES = (("pack", "op_start", "enqueued"), ("queued", "enqueued", "negotiate_start"),
          ("negotiate", "negotiate_start", "negotiate_end"), ("fuse", "fuse_start", "mpi_start"),
          ("mpi", "mpi_start", "mpi_end"), ("unpack", "mpi_end", "unpack_end"),
          ("returned", "finished", "returned"))


class RecordStruct(ctypes.Structure):
    """One ring record: ``TimelineRecord`` of timeline.h."""

    _fields_ = [("kind", ctypes.c_int64), ("engine", ctypes.c_int64),
                ("request", ctypes.c_int64), ("group", ctypes.c_int64),
                ("cycle", ctypes.c_int64), ("group_size", ctypes.c_int64),
                ("bytes", ctypes.c_int64), ("group_bytes", ctypes.c_int64),
                ("t", ctypes.c_int64 * len(STAMPS)), ("name", ctypes.c_char * 112)]


class RingSource:
    """Reads the compiled library's event ring for :mod:`hpcrep.comm.timeline`."""

    def __init__(self, library: Library) -> None:
        size, slots, stamps = library.timeline_layout()
        if size != ctypes.sizeof(RecordStruct) or stamps != len(STAMPS):
            raise RuntimeError(f"the compiled library's timeline records are {size} bytes with "
                               f"{stamps} stamps, Python expects {ctypes.sizeof(RecordStruct)} "
                               f"and {len(STAMPS)}; rebuild it")
        self._library = library
        self._buffer = (RecordStruct * 1024)()
        self._cursor: Optional[int] = None
        self._on = False
        self._lanes: list[int] = []  # per request lane: when its last collective ended
        self.dropped = 0

    def enable(self, on: bool, mark_cycles: bool) -> None:
        """Stamp allreduces into the ring (or stop). Switched on, it first skips what the ring
        holds: records of requests that returned after the last drain belong to no window."""
        if on and not self._on:
            self._library.timeline_enable(False, False)  # makes the ring on first use
            self._cursor = self._skip(self._cursor or 0)
        self._on = on
        self._library.timeline_enable(on, mark_cycles)

    def _skip(self, cursor: int) -> int:
        while True:
            n, cursor, _ = self._library.timeline_read(cursor, self._buffer)
            if n == 0:
                return cursor

    def drain(self) -> list[Record]:
        """Return the records written since the last drain as the recorder's tuples."""
        if self._cursor is None:
            return []
        out: list[Record] = []
        groups: set[tuple[int, int]] = set()
        cycles: set[tuple[int, int]] = set()
        requests: list[RecordStruct] = []
        while True:
            n, self._cursor, lost = self._library.timeline_read(self._cursor, self._buffer)
            self.dropped += lost
            for record in self._buffer[:n]:
                if record.kind == _REQUEST:
                    requests.append(RecordStruct.from_buffer_copy(record))
                elif record.kind == _CYCLE:
                    out.append(("cycle", "engine", "engine", record.t[2], record.t[8],
                                {"cycle": record.cycle, "offered": record.group_size}))
            if n < len(self._buffer):
                break
        # Which tensors shared each fusion buffer, for every member's args.
        members: dict[tuple[int, int], list[str]] = {}
        for r in requests:
            members.setdefault((r.engine, r.group), []).append(r.name.decode(errors="replace"))
        for r in sorted(requests, key=lambda r: r.t[0]):  # lanes are given in start order
            out.extend(self._request(r, groups, cycles, members[(r.engine, r.group)]))
        return out

    def _lane(self, start: int, end: int) -> str:
        for i, free_at in enumerate(self._lanes):
            if free_at <= start:
                self._lanes[i] = end
                return f"compiled allreduce {i}"
        self._lanes.append(end)
        return f"compiled allreduce {len(self._lanes) - 1}"

    def _request(self, r: RecordStruct, groups: set, cycles: set,
                 shared: list[str]) -> list[Record]:
        t = dict(zip(STAMPS, r.t))
        if not all(t.values()):  # the timeline was switched on or off while it ran
            return []
        name = r.name.decode(errors="replace")
        lane = self._lane(t["op_start"], t["returned"])
        cid = f"c{r.engine}.{r.request}"
        out: list[Record] = [("allreduce", "collective", lane, t["op_start"], t["returned"],
                              {"id": cid, "kind": "allreduce", "tensors": [name], "count": 1,
                               "bytes": int(r.bytes), "path": "compiled",
                               "bucket": f"{r.engine}.{r.group}", "fused": int(r.group_size),
                               "bucket_bytes": int(r.group_bytes), "cycle": int(r.cycle),
                               "bucket_tensors": shared[:16]})]
        for phase, a, b in PHASES:
            out.append((phase, "phase", lane, t[a], t[b],
                        {"collective": cid, "bytes": int(r.bytes) if phase == "mpi" else 0}))
        if (r.engine, r.cycle) not in cycles:
            cycles.add((r.engine, r.cycle))
            out.append(("negotiate", "engine", "engine", t["negotiate_start"],
                        t["negotiate_end"], {"cycle": int(r.cycle)}))
        if (r.engine, r.group) not in groups:
            groups.add((r.engine, r.group))
            out.append(("allreduce", "engine", "engine", t["fuse_start"], t["unpack_end"],
                        {"bucket": f"{r.engine}.{r.group}", "fused": int(r.group_size),
                         "bytes": int(r.group_bytes), "first": name}))
        return out
