"""The merged timeline from real 2-rank jobs (``timeline_job.py``): a tiny Keras model trained
for a few steps with HPCREP_TIMELINE on, on the compiled allreduce path and on the Python path
(``HPCREP_NATIVE=off``); then ``hpcrep analyze`` on what they wrote.

Checked on every trace: its structure (:func:`hpcrep.analysis.validate.problems`: valid JSON,
one process per rank, complete X events, ``ts`` monotone per lane, phases inside their
collective); that each step of the job appears once per rank; that the gradient allreduces are
there with their phases, on the path asked for. The step window (HPCREP_TIMELINE_STEPS) keeps
only the steps asked for and the collectives inside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrep.analysis import analyze, validate

JOB = str(Path(__file__).with_name("timeline_job.py"))
STEPS = 6
COMPILED_PHASES = {"pack", "queued", "negotiate", "fuse", "mpi", "unpack", "returned"}
PYTHON_PHASES = {"negotiate", "pack", "mpi", "unpack"}


def _run(mpirun, scratch: Path, native: str, *args: str, window: str = "") -> dict:
    path = scratch / f"trace-{native}-{window or 'all'}.json"
    env = {"HPCREP_TIMELINE": str(path), "HPCREP_NATIVE": native, "HPCREP_THREADS": "1",
           "HPCREP_TIMELINE_STEPS": window}
    proc = mpirun.run(2, [mpirun.python, JOB, str(STEPS), *args], timeout=280, env=env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.count("timeline job done") == 2, proc.stdout
    return json.loads(path.read_text())  # valid JSON, or this raises


def _steps(events: list[dict], rank: int) -> list[int]:
    return [e["args"]["step"] for e in events
            if e.get("cat") == "step" and e["pid"] == rank and e["ph"] == "X"]


@pytest.mark.timeout(320)
@pytest.mark.parametrize("native, path, phases, args", [
    ("on", "compiled", COMPILED_PHASES, ()),
    ("off", "python", PYTHON_PHASES, ()),
    ("on", "compiled", COMPILED_PHASES, ("--tape",)),
    ("off", "python", PYTHON_PHASES, ("--callback",)),
], ids=["compiled-fit", "python-fit", "compiled-tape", "python-fit-callback"])
def test_trace_of_a_real_two_rank_run_is_well_formed(mpirun, scratch, native, path, phases,
                                                     args):
    trace = _run(mpirun, scratch, native, *args)
    events = trace["traceEvents"]
    assert validate.problems(events, 2) == []
    for rank in (0, 1):
        assert _steps(events, rank) == list(range(STEPS))
        gradients = [e for e in events if e["pid"] == rank and e.get("cat") == "collective"
                     and e["args"].get("kind") == "allreduce" and e["args"]["path"] == path]
        assert len(gradients) >= STEPS, [e["name"] for e in events if e["pid"] == rank]
        ids = {g["args"]["id"] for g in gradients}
        seen = {e["name"] for e in events if e["pid"] == rank and e.get("cat") == "phase"
                and e["args"]["collective"] in ids}
        assert phases <= seen, seen
        assert all(g["args"]["bytes"] > 0 for g in gradients)
        # each exchange returns inside its step: the step's end mark waits for it
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == "step" and e["pid"] == rank]
        outside = [g["args"]["id"] for g in gradients
                   if not any(lo <= g["ts"] and g["ts"] + g["dur"] <= hi for lo, hi in steps)]
        assert outside == [], (outside, steps)
    if path == "compiled":  # which tensors shared a fusion buffer
        assert all(g["args"]["bucket_tensors"] for g in gradients)
    # the steps' exposed communication and MPI time are measured, never negative
    result = analyze(events)
    assert len(result.steps) == 2 * STEPS
    assert all(s.exposed >= 0 and s.mpi > 0 and s.compute > 0 for s in result.steps)


@pytest.mark.timeout(320)
def test_step_window_keeps_only_its_steps(mpirun, scratch):
    trace = _run(mpirun, scratch, "on", window="2:3")
    events = trace["traceEvents"]
    assert validate.problems(events, 2) == []
    for rank in (0, 1):
        assert _steps(events, rank) == [2, 3]
        steps = [e for e in events if e.get("cat") == "step" and e["pid"] == rank]
        lo = min(s["ts"] for s in steps)
        hi = max(s["ts"] + s["dur"] for s in steps)
        kept = [e for e in events if e["pid"] == rank and e.get("cat") == "collective"]
        assert kept, "the window's own allreduces are kept"
        assert all(lo <= e["ts"] <= hi for e in kept), [(e["name"], e["ts"]) for e in kept]
        # nor the broadcast of the initial weights, before step 0
        assert not [e for e in kept if e["args"].get("kind") == "broadcast"]


@pytest.mark.timeout(320)
def test_hpcrep_analyze_prints_the_figures_of_a_real_trace(mpirun, scratch):
    _run(mpirun, scratch, "on")
    trace = scratch / "trace-on-all.json"
    png = scratch / "figures.png"
    proc = subprocess.run([sys.executable, "-m", "hpcrep.cli", "analyze", str(trace), "--against",
                           str(trace), "--png", str(png)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for words in ("exposed comm ms", "overlap", "straggler score", "allreduce",
                  "rank 0 (", "rank 1 ("):
        assert words in proc.stdout, proc.stdout
    assert png.stat().st_size > 1000
