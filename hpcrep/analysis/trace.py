"""Figures of a merged timeline (:mod:`hpcrep.comm.timeline_file`'s Chrome trace). Pure.

Definitions, per rank and step (a ``cat: "step"`` event; a trace without steps is one step):

- a step's *collectives* are the ``cat: "collective"`` events that start inside it;
- *compute end* is the start of the step's last collective: the moment this rank asked for its
  last exchange, after which it has nothing left to compute but to wait for the results (and
  apply them);
- *exposed communication* is the time after compute end during which a collective of the step
  is in flight (the union of their intervals, cut at compute end): the time the caller waits on
  collectives;
- *compute* is the step's duration minus its exposed communication;
- *overlap fraction* is the part of the step's MPI time (the union of its ``mpi`` phases) that
  lies before compute end, hidden behind compute, over all of its MPI time (None without MPI);
- *bytes* are the collectives' ``args.bytes``; *bandwidth* per kind is those bytes over the
  summed durations of their ``mpi`` phases;
- the *straggler score* of a rank is the mean, over collectives seen on every rank (the k-th
  collective of the same kind and first tensor name on each), of how much later than the median
  rank it arrived (the collective's start), in ms; negative: it arrived early.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Sequence

import numpy as np

Interval = tuple[float, float]


def load(path: str) -> list[dict]:
    """Return the events of a Chrome-trace file (``{"traceEvents": [...]}`` or a bare list).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON, or not of a Chrome trace's shape (the message says which).
    """
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        got = (f"an object with keys {', '.join(sorted(map(str, data))[:5]) or 'none'}"
               if isinstance(data, dict) else f"a JSON {type(data).__name__}")
        raise ValueError(f"{path} is not a Chrome trace: expected {{\"traceEvents\": [...]}} or "
                         f"a list of events (objects), got {got}")
    return events


def union_length(intervals: Sequence[Interval], lo: float = -np.inf,
                 hi: float = np.inf) -> float:
    """Return the length of the union of ``intervals`` cut to ``[lo, hi]``."""
    cut = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, end = 0.0, -np.inf
    for a, b in cut:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@dataclasses.dataclass(frozen=True)
class StepFigures:
    """One rank's figures for one step (times in ms)."""

    rank: int
    step: int
    duration: float
    compute: float
    exposed: float
    mpi: float
    hidden_mpi: float
    bytes: int
    collectives: int

    @property
    def overlap(self) -> Optional[float]:
        """MPI time hidden behind compute over all MPI time; None without MPI."""
        return self.hidden_mpi / self.mpi if self.mpi > 0 else None


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Every figure of one trace."""

    ranks: dict[int, str]                      # pid -> process name
    steps: list[StepFigures]
    per_kind: dict[str, dict[str, float]]      # kind -> count, bytes, mpi_ms, gbps (all ranks)
    straggler_ms: dict[int, float]             # rank -> mean lateness
    matched: int                               # collectives seen on every rank

    def step_numbers(self) -> list[int]:
        """Return the step numbers present, sorted."""
        return sorted({s.step for s in self.steps})

    def mean_over_ranks(self, step: int) -> dict[str, Optional[float]]:
        """Return the step's figures averaged over the ranks that have it."""
        rows = [s for s in self.steps if s.step == step]
        mpi = sum(s.mpi for s in rows)
        return {"duration": float(np.mean([s.duration for s in rows])),
                "compute": float(np.mean([s.compute for s in rows])),
                "exposed": float(np.mean([s.exposed for s in rows])),
                "mpi": float(np.mean([s.mpi for s in rows])),
                "overlap": sum(s.hidden_mpi for s in rows) / mpi if mpi > 0 else None,
                "bytes": float(np.mean([s.bytes for s in rows]))}

    def totals(self) -> dict[str, Optional[float]]:
        """Return the figures summed over steps (each step averaged over ranks first)."""
        per = [self.mean_over_ranks(n) for n in self.step_numbers()]
        mpi = sum(s.mpi for s in self.steps)
        return {"steps": len(per),
                "duration": sum(p["duration"] for p in per),
                "compute": sum(p["compute"] for p in per),
                "exposed": sum(p["exposed"] for p in per),
                "mpi": sum(p["mpi"] for p in per),
                "overlap": sum(s.hidden_mpi for s in self.steps) / mpi if mpi > 0 else None,
                "bytes": sum(p["bytes"] for p in per)}

    def straggler(self) -> Optional[int]:
        """Return the rank that arrives latest on average (None with fewer than 2 ranks)."""
        if len(self.straggler_ms) < 2:
            return None
        return max(self.straggler_ms, key=lambda r: self.straggler_ms[r])


def _x_events(events: Sequence[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X"]


def _steps_of(rank_events: list[dict]) -> list[tuple[int, float, float]]:
    steps = sorted((int(e.get("args", {}).get("step", i)), e["ts"], e["ts"] + e["dur"])
                   for i, e in enumerate(x for x in rank_events if x.get("cat") == "step"))
    if steps:
        return steps
    if not rank_events:
        return []
    return [(0, min(e["ts"] for e in rank_events),
             max(e["ts"] + e["dur"] for e in rank_events))]


def _step_figures(rank: int, step: int, lo: float, hi: float, collectives: list[dict],
                  mpi_of: dict[Any, list[Interval]]) -> StepFigures:
    inside = [c for c in collectives if lo <= c["ts"] <= hi]
    spans = [(c["ts"], c["ts"] + c["dur"]) for c in inside]
    mpi = [iv for c in inside for iv in mpi_of.get(c["args"].get("id"), [])]
    compute_end = max((c["ts"] for c in inside), default=hi)
    exposed = union_length(spans, compute_end, hi)
    duration = hi - lo
    return StepFigures(rank=rank, step=step, duration=duration / 1e3,
                       compute=(duration - exposed) / 1e3, exposed=exposed / 1e3,
                       mpi=union_length(mpi) / 1e3,
                       hidden_mpi=union_length(mpi, lo, compute_end) / 1e3,
                       bytes=int(sum(c["args"].get("bytes", 0) for c in inside)),
                       collectives=len(inside))


def _stragglers(collectives: dict[int, list[dict]]) -> tuple[dict[int, float], int]:
    keyed: dict[int, dict[tuple, float]] = {}
    for rank, items in collectives.items():
        seen: dict[tuple, int] = {}
        keyed[rank] = {}
        for c in sorted(items, key=lambda e: e["ts"]):
            args = c.get("args", {})
            tensors = args.get("tensors") or [""]
            base = (args.get("kind", c["name"]), tensors[0])
            k = seen.get(base, 0)
            seen[base] = k + 1
            keyed[rank][(*base, k)] = c["ts"]
    ranks = sorted(keyed)
    common = set.intersection(*(set(keyed[r]) for r in ranks)) if ranks else set()
    late: dict[int, list[float]] = {r: [] for r in ranks}
    for key in common:
        arrivals = np.array([keyed[r][key] for r in ranks])
        median = float(np.median(arrivals))
        for r, t in zip(ranks, arrivals):
            late[r].append((t - median) / 1e3)
    return ({r: float(np.mean(v)) if v else 0.0 for r, v in late.items()}, len(common))


def analyze(events: Sequence[dict]) -> Analysis:
    """Return the figures of a merged timeline's events (see the module's definitions)."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    by_rank: dict[int, list[dict]] = {}
    for e in _x_events(events):
        by_rank.setdefault(int(e["pid"]), []).append(e)
    steps: list[StepFigures] = []
    collectives: dict[int, list[dict]] = {}
    per_kind: dict[str, dict[str, float]] = {}
    for rank, rank_events in sorted(by_rank.items()):
        mine = [e for e in rank_events if e.get("cat") == "collective"]
        collectives[rank] = mine
        mpi_of: dict[Any, list[Interval]] = {}
        for e in rank_events:
            if e.get("cat") == "phase" and e["name"] == "mpi":
                mpi_of.setdefault(e["args"].get("collective"), []).append(
                    (e["ts"], e["ts"] + e["dur"]))
        for c in mine:
            kind = c["args"].get("kind", c["name"])
            row = per_kind.setdefault(kind, {"count": 0, "bytes": 0, "mpi_ms": 0.0})
            row["count"] += 1
            row["bytes"] += c["args"].get("bytes", 0)
            row["mpi_ms"] += sum(b - a for a, b in mpi_of.get(c["args"].get("id"), [])) / 1e3
        for step, lo, hi in _steps_of(rank_events):
            steps.append(_step_figures(rank, step, lo, hi, mine, mpi_of))
    for row in per_kind.values():
        row["gbps"] = row["bytes"] / (row["mpi_ms"] * 1e6) if row["mpi_ms"] > 0 else 0.0
    straggler_ms, matched = _stragglers(collectives)
    return Analysis({r: names.get(r, f"rank {r}") for r in by_rank}, steps, per_kind,
                    straggler_ms, matched)
