"""Pooling one variant's timings over repeated jobs of the same benchmark.

Rounds inside one job share its placement, memory layout and warm-up, so their min-max cannot
show how much a second job of the same kind differs. ``hpcrep bench --repeats R`` therefore runs
each job R times and pools their rounds here: a figure is the median over every round of every
job, with the min-max over them; a per-round ratio is still only formed between variants timed
in the same round of the same job (the rounds are concatenated in job order for every variant
alike, so round ``i`` of one variant and round ``i`` of another come from the same round of the
same job). The per-job medians are kept beside each figure so a reader sees the job-to-job drift.

Everything here is local and pure (no MPI, no TensorFlow).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from bench.exposed import pool_traces
from bench.timing import spread


def pool_jobs(jobs: Sequence[dict[str, dict]]) -> dict[str, dict]:
    """Pool the timings of repeated jobs of one variant (one ``runs`` dict per job, as
    :func:`bench.job.run_modes` wrote it: mode -> timing), in the order the jobs ran.

    Each mode gets ``round_ms`` and ``step_times_ms`` concatenated in job order, ``step_ms`` with
    min-max and ``throughput`` with min-max over all those rounds, ``jobs`` (how many jobs),
    ``rounds`` (all rounds pooled), ``job_rounds`` (rounds per job), ``job_step_ms`` (each job's
    median step time), ``job_warmup_ms`` (each job's warm-up steps), ``trace`` where jobs traced
    the mode (:func:`bench.exposed.pool_traces`), ``autotune`` where jobs settled a tuner for
    it (each job's settlement, in job order) and ``check``: the first
    failed job's check, else the first job's, with ``job_checks_ok`` (each job's verdict). Then
    :func:`bench.job.split_communication` sets ``comm_ms``, ``vs_nosync`` (per-round ratios over
    all rounds, with ``jobs``: each job's median ratio) and withholds the figures of a mode that
    failed its self-check in any job.

    Raises:
        ValueError: no jobs, or jobs that did not time the same modes with the same steps per
            round.
    """
    from bench.job import split_communication  # noqa: PLC0415

    if not jobs:
        raise ValueError("pool_jobs needs at least one job's runs, got none")
    modes = list(jobs[0])
    for i, runs in enumerate(jobs[1:], start=2):
        if sorted(runs) != sorted(modes):
            raise ValueError(f"job {i} timed modes {sorted(runs)}, job 1 timed {sorted(modes)}: "
                             "only repeats of the same job can be pooled")
    pooled = {mode: _pool_mode([runs[mode] for runs in jobs]) for mode in modes}
    split_communication(pooled)
    for r in pooled.values():
        if "learner_steps_per_s" in r:  # D4PG's, at the pooled median (None once withheld)
            r["learner_steps_per_s"] = 1e3 / r["step_ms"] if r.get("step_ms") else None
        if r.get("vs_nosync") is not None:
            ratios = [b / t for b, t in zip(pooled["nosync"]["round_ms"], r["round_ms"])]
            r["vs_nosync"]["jobs"] = job_medians(ratios, r["job_rounds"])
    return pooled


def _pool_mode(timings: list[dict]) -> dict:
    """One mode's timings from several jobs, pooled (see :func:`pool_jobs`)."""
    steps = {t.get("steps_per_round") for t in timings}
    if len(steps) > 1:
        raise ValueError(f"jobs timed {sorted(steps)} steps per round: only repeats of the same "
                         "job can be pooled")
    round_ms = [float(x) for t in timings for x in _rounds_of(t)]
    s = spread(round_ms)
    items = _items_per_step(timings)
    threads = {t.get("threads_per_rank") for t in timings}
    checks = [t.get("check") for t in timings]
    failed = [c for c in checks if c is not None and not c.get("ok", True)]
    out = dict(timings[0])
    out.update({
        "step_ms": s["median"], "step_ms_min": s["min"], "step_ms_max": s["max"],
        "round_ms": round_ms,
        "throughput": None if items is None else items / s["median"] * 1e3,
        "throughput_min": None if items is None else items / s["max"] * 1e3,
        "throughput_max": None if items is None else items / s["min"] * 1e3,
        "items_per_step": items,
        "jobs": len(timings), "rounds": len(round_ms),
        "job_rounds": [len(_rounds_of(t)) for t in timings],
        "job_step_ms": [float(np.median(_rounds_of(t))) for t in timings],
        "job_warmup_ms": [list(t.get("warmup_ms") or []) for t in timings],
        "step_times_ms": [float(x) for t in timings for x in t.get("step_times_ms") or []],
        "threads_per_rank": threads.pop() if len(threads) == 1 else None,
        "check": failed[0] if failed else checks[0],
        "job_checks_ok": [None if c is None else bool(c.get("ok", True)) for c in checks]})
    out.pop("warmup_ms", None)
    out.pop("failed", None)
    if any("autotune" in t for t in timings):  # hpcrep_autotune: each job settled its own tuner
        out["autotune"] = [t.get("autotune") for t in timings]
    traces = [t.get("trace") for t in timings]
    if any(traces):
        out["trace"] = pool_traces(traces)
    else:
        out.pop("trace", None)
    if out["check"] is None:
        out.pop("check")
    return out


def _rounds_of(timing: dict) -> list[float]:
    """A job's per-round step times (a single figure for a job without them)."""
    rounds = timing.get("round_ms")
    if rounds:
        return list(rounds)
    if timing.get("step_ms") is None:
        raise ValueError("a job's timing has neither round_ms nor step_ms: nothing to pool")
    return [timing["step_ms"]]


def _items_per_step(timings: list[dict]) -> Optional[float]:
    """Items one step processes (the whole job's), from the first timing that records it or
    lets it be recovered from throughput x step time."""
    for t in timings:
        if t.get("items_per_step"):
            return float(t["items_per_step"])
    for t in timings:
        if t.get("throughput") and t.get("step_ms"):
            return float(t["throughput"]) * float(t["step_ms"]) / 1e3
    return None


def job_medians(values: Sequence[float], job_rounds: Sequence[int]) -> list[float]:
    """The median of each job's stretch of ``values`` (rounds concatenated in job order,
    ``job_rounds[i]`` of them from job ``i``).

    Raises:
        ValueError: the job lengths do not add up to ``len(values)``, or a job has no rounds.
    """
    if sum(job_rounds) != len(values) or any(k < 1 for k in job_rounds):
        raise ValueError(f"{len(values)} rounds cannot be split into jobs of {list(job_rounds)}")
    out, start = [], 0
    for k in job_rounds:
        out.append(float(np.median(values[start:start + k])))
        start += k
    return out


def pooled_ratio(base_ms: Sequence[float], ms: Sequence[float],
                 job_rounds: Optional[Sequence[int]] = None) -> dict:
    """``base / ms`` round by round (both timed in the same rounds of the same jobs), as
    ``{"median", "min", "max"}`` over all rounds, plus ``jobs`` (each job's median ratio) when
    ``job_rounds`` is given."""
    from bench.job import round_ratio  # noqa: PLC0415

    out = round_ratio(base_ms, ms)
    if job_rounds:
        out["jobs"] = job_medians([b / t for b, t in zip(base_ms, ms)], job_rounds)
    return out
