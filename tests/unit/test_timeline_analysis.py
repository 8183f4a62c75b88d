"""``hpcrep analyze`` on small hand-built traces whose answers are known, and the merged file's
writer (:func:`hpcrep.comm.timeline_file.chrome_events`) and checker
(:func:`hpcrep.analysis.validate.problems`) on records made by hand.

The trace: three ranks, one step of 100 ms each, two allreduces per step. Rank 0 and rank 2 ask
for them at 20 and 60 ms, rank 1 at 25 and 70 ms (5 and 10 ms late). On rank 0 the first
allreduce runs 20-70 ms (MPI 30-50), the second 60-90 ms (MPI 75-85): its compute ends at 60 ms
(its last request), so exposed communication is 60-90 = 30 ms, compute 70 ms, and 20 of its 30
ms of MPI lie before 60 ms: overlap 2/3.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpcrep.analysis import analyze, validate
from hpcrep.analysis.command import main as analyze_main
from hpcrep.analysis.trace import union_length
from hpcrep.comm import timeline_file

MS = 1000.0  # trace times are microseconds


def _rank(pid: int, c1: tuple, c2: tuple, mpi1: tuple, mpi2: tuple) -> list[dict]:
    def x(name, cat, lo, hi, **args):
        return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": 1, "ts": lo * MS,
                "dur": (hi - lo) * MS, "args": args}
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"rank {pid} (host)"}},
            x("step 0", "step", 0, 100, step=0),
            x("allreduce", "collective", *c1, id=f"{pid}a", kind="allreduce",
              tensors=["grads.0"], bytes=4_000_000),
            x("mpi", "phase", *mpi1, collective=f"{pid}a", bytes=4_000_000),
            x("allreduce", "collective", *c2, id=f"{pid}b", kind="allreduce",
              tensors=["grads.1"], bytes=2_000_000),
            x("mpi", "phase", *mpi2, collective=f"{pid}b", bytes=2_000_000)]


def _trace() -> list[dict]:
    return (_rank(0, (20, 70), (60, 90), (30, 50), (75, 85))
            + _rank(1, (25, 70), (70, 90), (30, 50), (75, 85))
            + _rank(2, (20, 70), (60, 90), (30, 50), (75, 85)))


def test_exposed_communication_compute_and_overlap_of_a_known_step():
    result = analyze(_trace())
    by_rank = {s.rank: s for s in result.steps}
    r0, r1 = by_rank[0], by_rank[1]
    assert (r0.duration, r0.exposed, r0.compute, r0.mpi) == pytest.approx((100, 30, 70, 30))
    assert r0.overlap == pytest.approx(2 / 3)
    # rank 1 asked last at 70 ms: exposed 70-90, and MPI 75-85 is not hidden any more
    assert (r1.exposed, r1.compute, r1.overlap) == pytest.approx((20, 80, 2 / 3))
    assert r0.bytes == 6_000_000
    totals = result.totals()
    assert totals["exposed"] == pytest.approx((30 + 20 + 30) / 3)
    assert totals["overlap"] == pytest.approx(2 / 3)


def test_bandwidth_per_collective_kind():
    row = analyze(_trace()).per_kind["allreduce"]
    assert row["count"] == 6 and row["bytes"] == 18_000_000
    assert row["mpi_ms"] == pytest.approx(90)
    assert row["gbps"] == pytest.approx(18e6 / 90e-3 / 1e9)


def test_straggler_score_names_the_late_rank():
    result = analyze(_trace())
    assert result.matched == 2
    assert result.straggler() == 1
    assert result.straggler_ms[1] == pytest.approx((5 + 10) / 2)
    assert result.straggler_ms[0] == pytest.approx(0) and result.straggler_ms[2] == pytest.approx(0)


def test_union_length_counts_overlapping_intervals_once():
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_length([(0, 10), (5, 15), (20, 30)], 8, 25) == 12


def test_analyze_command_prints_both_runs_and_draws(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _trace()}))
    png = tmp_path / "t.png"
    args = type("A", (), {"trace": str(path), "against": str(path), "png": str(png),
                          "max_steps": 50})()
    pytest.importorskip("matplotlib")
    assert analyze_main(args) == 0
    out = capsys.readouterr().out
    assert "straggler score" in out and "<- latest" in out and "overlap fraction" in out
    assert "26.67" in out  # the step's exposed communication, mean over ranks
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("content, says", [
    ('{"a": 1}', "is not a Chrome trace: expected"),
    ("[1, 2]", "is not a Chrome trace: expected"),
    ("not json", "is not JSON"),
    ('{"traceEvents": []}', "holds no training step and no collective (0 events)"),
    ("[]", "holds no training step and no collective"),
    ('[{"ph": "X"}]', "is not an hpcrep timeline"),
])
def test_analyze_command_refuses_what_is_not_a_trace_in_one_line(tmp_path, capsys, content,
                                                                  says):
    path = tmp_path / "t.json"
    path.write_text(content)
    args = type("A", (), {"trace": str(path), "against": None, "png": None, "max_steps": 50})()
    assert analyze_main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err and str(path) in err, err
    assert "Traceback" not in err


def _records(offset_ns: int) -> dict:
    """One rank's records: a collective 1-3 ms with phases, on its own clock."""
    base = 10_000_000 + offset_ns
    return {"host": "h", "offset_ns": offset_ns, "dropped": 0, "records": [
        ("allreduce", "collective", "python t", base + 1_000_000, base + 3_000_000,
         {"id": 1, "kind": "allreduce", "bytes": np.int64(64)}),
        ("mpi", "phase", "python t", base + 1_500_000, base + 2_500_000,
         {"collective": 1, "bytes": 64}),
        ("step 0", "step", "steps", base, base + 4_000_000, {"step": 0})]}


def test_merged_events_are_on_rank_zeros_clock_and_well_formed():
    events = timeline_file.chrome_events([_records(0), _records(7_000_000)])
    assert validate.problems(events, 2) == []
    json.dumps(events)  # numpy scalars became numbers
    steps = {e["pid"]: e["ts"] for e in events if e.get("cat") == "step"}
    assert steps == {0: 0.0, 1: 0.0}  # rank 1's clock ran 7 ms ahead: taken off
    names = [e["args"]["name"] for e in events if e.get("name") == "thread_name"]
    assert names.count("steps") == 2 and names.count("python t") == 2


def test_checker_catches_each_kind_of_malformed_trace():
    good = timeline_file.chrome_events([_records(0), _records(0)])
    assert validate.problems(good, 2) == []
    assert "process_name" in validate.problems(good, 3)[0]
    phase = next(i for i, e in enumerate(good) if e.get("cat") == "phase")
    outside = [dict(e, dur=e["dur"] * 10) if i == phase else e for i, e in enumerate(good)]
    assert "outside its collective" in " ".join(validate.problems(outside, 2))
    lost = [dict(e, args={"collective": 99}) if i == phase else e for i, e in enumerate(good)]
    assert "names collective 99" in " ".join(validate.problems(lost, 2))
    backwards = good + [dict(good[phase], ts=-5.0)]
    assert "comes after" in " ".join(validate.problems(backwards, 2))
    no_dur = good + [{k: v for k, v in good[phase].items() if k != "dur"}]
    assert "lacks ['dur']" in " ".join(validate.problems(no_dur, 2))
