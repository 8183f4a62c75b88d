"""Is a merged timeline well formed? The checks ``hpcrep analyze`` and the tests rely on. Pure."""

from __future__ import annotations

from typing import Sequence

TOLERANCE_US = 0.01  # ts and dur are microseconds from integer nanoseconds: rounding only


def problems(events: Sequence[dict], ranks: int) -> list[str]:
    """Return what is wrong with a merged trace of ``ranks`` ranks (empty: nothing).

    Checked: one ``process_name`` per rank (pids 0..ranks-1, named ``rank R (host)``); every
    ``X`` event has ``name``, ``pid``, ``tid``, ``ts`` and ``dur >= 0``; ``ts`` never decreases
    along a lane (pid, tid) in file order; every ``phase`` names a ``collective`` of its rank
    (``args.collective`` = its ``args.id``) and lies inside it.
    """
    out: list[str] = []
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    if sorted(names) != list(range(ranks)):
        out.append(f"process_name records for pids {sorted(names)}, expected 0..{ranks - 1}")
    for pid, name in names.items():
        if not str(name).startswith(f"rank {pid} ("):
            out.append(f"pid {pid} is named {name!r}, expected 'rank {pid} (host)'")
    last: dict[tuple, float] = {}
    collectives: dict[tuple, tuple[float, float]] = {}
    phases = []
    for i, e in enumerate(events):
        if e.get("ph") != "X":
            continue
        missing = [k for k in ("name", "pid", "tid", "ts", "dur") if k not in e]
        if missing:
            out.append(f"event {i} ({e.get('name')}) lacks {missing}")
            continue
        if e["dur"] < 0:
            out.append(f"event {i} ({e['name']}) has dur {e['dur']} < 0")
        lane = (e["pid"], e["tid"])
        if e["ts"] < last.get(lane, float("-inf")):
            out.append(f"event {i} ({e['name']}) at ts {e['ts']} comes after ts "
                       f"{last[lane]} on lane {lane}")
        last[lane] = e["ts"]
        args = e.get("args", {})
        if e.get("cat") == "collective":
            collectives[(e["pid"], args.get("id"))] = (e["ts"], e["ts"] + e["dur"])
        elif e.get("cat") == "phase":
            phases.append((i, e))
    for i, e in phases:
        key = (e["pid"], e.get("args", {}).get("collective"))
        if key not in collectives:
            out.append(f"phase {i} ({e['name']}) names collective {key[1]!r}, not on rank "
                       f"{key[0]}")
            continue
        lo, hi = collectives[key]
        if e["ts"] < lo - TOLERANCE_US or e["ts"] + e["dur"] > hi + TOLERANCE_US:
            out.append(f"phase {i} ({e['name']}) [{e['ts']}, {e['ts'] + e['dur']}] lies "
                       f"outside its collective [{lo}, {hi}] on rank {e['pid']}")
    return out
