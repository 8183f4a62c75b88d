"""The fusion sweep's report (bench/allreduce_sweep.py): the best cell, the defaults beside it,
and the tables, from a report shaped like the jobs' own."""

import pytest

from bench.allreduce_sweep import CHUNKS, THRESHOLDS, best, render_markdown


def fake_report(ms) -> dict:
    """A sweep report whose cell (threshold, chunk) took ``ms(threshold, chunk)`` ms."""
    jobs = {str(t): {"ranks": 2, "threshold": t, "path": "compiled", "bytes": 102_228_128,
                     "tensors": 214, "nodes": 1, "rounds": 3, "steps_per_round": 3,
                     "raw_inplace": {"ms": 40.0, "ms_min": 39.0, "ms_max": 42.0},
                     "chunks": {str(c): {"ms": ms(t, c), "ms_min": ms(t, c) - 1,
                                         "ms_max": ms(t, c) + 1} for c in CHUNKS}}
            for t in THRESHOLDS}
    report = {"date": "2026-11-27T02:00:00", "cluster": None, "ranks": 2,
              "thresholds": list(THRESHOLDS), "chunks": list(CHUNKS), "jobs": jobs}
    report["best"] = best(report)
    return report


def test_the_best_cell_and_the_defaults_ratio_to_it():
    # Fastest at 64 MiB buckets sent whole; the defaults (16 MiB, 4 MiB pieces) take 50 ms.
    def ms(t, c):
        return 30.0 if (t, c) == (64 << 20, 0) else 50.0 if (t, c) == (16 << 20, 4 << 20) else 60.0
    b = fake_report(ms)["best"]
    assert (b["threshold"], b["chunk"], b["ms"]) == (64 << 20, 0, 30.0)
    assert (b["default_threshold"], b["default_chunk"]) == (16 << 20, 4 << 20)
    assert b["default_ms"] == 50.0 and b["default_over_best"] == pytest.approx(50 / 30)


def test_the_tables_have_a_row_per_threshold_and_a_column_per_piece_size():
    md = render_markdown(fake_report(lambda t, c: 40.0 + (t >> 20) / 64 + (c >> 20)))
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    header = rows[0]
    assert header.count("|") == len(CHUNKS) + 3 and "whole bucket" in header
    ms_rows = [r for r in rows if r.startswith("| 1 MiB") or r.startswith("| 256 MiB")]
    assert len(ms_rows) == 4  # both tables: ms and ratio to the job's raw allreduce
    # 256 MiB buckets, 16 MiB pieces: 40 + 4 + 16 = 60 ms, 1.50x the raw 40 ms
    assert "60.0 [59.0-61.0]" in md and "1.50x" in md
    assert "Best cell: fusion threshold 1 MiB, pieces whole bucket: 40.0 ms." in md
    assert "hpcrep's defaults (16 MiB, 4 MiB): 44.2 ms, 1.11x the best cell." in md


def test_the_autotune_section_sets_the_tuner_beside_the_best_cell():
    report = fake_report(lambda t, c: 50.0)
    cell = {"ms_min": 1.0, "ms_max": 2.0}
    report["autotune"] = {
        "best_threshold": 256 << 20, "best_chunk": 1 << 20, "settled": True, "settle_steps": 43,
        "settle_seconds": 6.2, "chosen": {"threshold": 16 << 20, "chunk": 1 << 20},
        "warmup": 2, "measure": 5, "trials": [
            {"step": 7, "threshold": 16 << 20, "chunk": 4 << 20, "ms": 68.0},
            {"step": 14, "threshold": 16 << 20, "chunk": 1 << 20, "ms": 60.0}],
        "best_fixed": {"ms": 58.0, **cell}, "autotuned": {"ms": 60.9, **cell},
        "default": {"ms": 69.6, **cell}}
    md = render_markdown(report)
    assert "settled after 43 steps (6 s; 2 settings timed, 2 + 5 steps each) on fusion 16 MiB, " \
        "pieces 1 MiB" in md
    assert "| autotuned | 60.9 [1.0-2.0] | 1.05x |" in md
    assert "| defaults | 69.6 [1.0-2.0] | 1.20x |" in md
    assert "16 MiB/4 MiB 68; 16 MiB/1 MiB 60." in md
