"""Exposed communication and overlap of a benchmark job's step, read from a timeline of it.

``hpcrep bench`` subtracts step times (a variant's step minus the same job's no-sync step) to get
what communication costs; that cannot say how much of the exchange ran hidden behind the
backward pass. So after its timed rounds, a job records a few more steps of hpcrep's variant with
the timeline on (``hvd.start_timeline``), marking each step from the loop that calls it, and
reads the figures of :mod:`hpcrep.analysis.trace` from the merged file: per step, the exposed
communication (the time the step waits on collectives after asking for its last one), compute,
MPI time and the overlap fraction (the share of MPI time that lay before compute end). The
trace is kept next to the job's results (``<job>.trace.json``) for ``hpcrep analyze`` and
Perfetto.

The step function was traced before the timeline started, so it carries no step marks of its
own: the marks here are the only ones, and a step is one call of it, which returns once its
results are computed (eager TensorFlow runs a function synchronously). The timeline's cost
(measured at about its noise on ResNet-50, docs/measurements.md) falls on these steps only,
never on the timed rounds.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

# Steps recorded; each adds its step time to the job.
TRACED_STEPS = 3


def trace_path(bench_json: Optional[str]) -> Optional[str]:
    """The trace file kept beside a job's results file (None without one)."""
    if not bench_json:
        return None
    return os.path.splitext(bench_json)[0] + ".trace.json"


def traced_figures(step: Callable[[], object], path: str,
                   steps: int = TRACED_STEPS) -> Optional[dict]:
    """Run ``step`` ``steps`` times with the timeline recording into ``path``, then return the
    mean per-step figures of the trace (rank 0; None on the other ranks): ``steps``,
    ``step_ms``, ``exposed_ms``, ``compute_ms``, ``mpi_ms``, ``overlap`` (None without MPI
    time), ``bytes`` and ``file`` (the trace's file name).

    Collective: every rank must call this, with the same ``steps`` (``step`` communicates and
    the timeline starts and stops on every rank).
    """
    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from hpcrep.analysis import trace  # noqa: PLC0415
    from hpcrep.comm import timeline  # noqa: PLC0415

    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    hvd.start_timeline(path)
    try:
        for _ in range(steps):
            timeline.step_begin("loop")
            step()
            timeline.step_end("loop")
    finally:
        hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    totals = trace.analyze(trace.load(path)).totals()
    traced = int(totals["steps"])
    n = max(1, traced)
    return {"steps": traced, "step_ms": totals["duration"] / n,
            "exposed_ms": totals["exposed"] / n, "compute_ms": totals["compute"] / n,
            "mpi_ms": totals["mpi"] / n, "overlap": totals["overlap"],
            "bytes": totals["bytes"] / n, "file": os.path.basename(path)}


def pool_traces(traces: list[Optional[dict]]) -> Optional[dict]:
    """Pool the ``trace`` figures of repeated jobs (None where a job has none): the median over
    jobs of each figure with its min and max (``<figure>_min``/``_max``), ``jobs`` (how many
    had a trace) and ``files``. None when no job had one. Local."""
    import numpy as np  # noqa: PLC0415

    have = [t for t in traces if t]
    if not have:
        return None
    out: dict = {"jobs": len(have), "steps": sum(t.get("steps", 0) for t in have),
                 "files": [t.get("file") for t in have]}
    for key in ("step_ms", "exposed_ms", "compute_ms", "mpi_ms", "overlap", "bytes"):
        values = [float(t[key]) for t in have if t.get(key) is not None]
        if not values:
            out[key] = None
            continue
        out[key] = float(np.median(values))
        out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return out
