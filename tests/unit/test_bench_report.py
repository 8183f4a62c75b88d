"""The benchmark report: derived efficiencies and ratios, the projection, (re-)rendering."""

from __future__ import annotations

import json

import pytest

from bench.projection import allreduce_seconds, project


def test_ring_allreduce_cost_model():
    assert allreduce_seconds(1e9, 1, 10.0, 1e-6, 1e-3) == 0.0
    # p=4: 2*3/4 * 1 GB / 10 GB/s = 0.15 s, + 6 * 1 us, + 1 ms software
    assert allreduce_seconds(1e9, 4, 10.0, 1e-6, 1e-3) == pytest.approx(0.15 + 6e-6 + 1e-3)


def test_projection_falls_with_ranks_and_overlap_helps():
    proj = project({"big": {"compute_ms": 100.0, "grad_bytes": 100e6},
                    "tiny": {"compute_ms": 5.0, "grad_bytes": 1e4, "syncs_per_step": 2}},
                   memcpy_gbps=11.0, software_ms=0.3)
    assert proj["effective_bandwidth_gbps"] == 11.0  # capped by memcpy below 12.5
    for m in proj["models"].values():
        assert all(a >= b for a, b in zip(m["no_overlap"], m["no_overlap"][1:]))
        assert all(o >= n for o, n in zip(m["overlap"], m["no_overlap"]))
        assert 0 < m["no_overlap"][-1] < 1
    t = 0.3e-3 + 2 * 7 / 8 * 100e6 / 11e9 + 14 * 2e-6
    assert proj["models"]["big"]["no_overlap"][0] == pytest.approx(0.1 / (0.1 + t))


def fake_report() -> dict:
    def run(thr, step, comm):
        return {"throughput": thr, "step_ms": step, "comm_ms": comm, "compute_ms": step - comm,
                "comm_fraction": comm / step}
    return {
        "created": "2026-01-01T00:00:00", "quick": True, "ranks": [1, 2], "seconds": 1.0,
        "machine": {"host": "h", "cores": 2, "cpu": "c", "memory_gib": 1, "load_average": [0]},
        "versions": {"python": "3.11"}, "errors": [],
        "peers": {"horovod": {"status": "not importable", "error": "ModuleNotFoundError"}},
        "models": {"resnet50": {"unit": "images/s", "grad_bytes": 1e8, "grad_tensors": 214,
                                "runs": {"hpcrep": {"1": run(100, 80, 0), "2": run(150, 107, 30)},
                                         "nosync": {"1": run(100, 80, 0), "2": run(200, 80, 0)},
                                         "mwms": {"1": run(90, 90, 0), "2": run(120, 133, 0)}}}},
        "allreduce": {"memcpy_gbps": 11.0, "runs": {"2": {
            "sizes": [{"bytes": 4096, "raw_ms": 0.02, "raw_inplace_ms": 0.02,
                       "hpcrep_numpy_ms": 0.05, "hpcrep_tf_ms": 0.3},
                      {"bytes": 1 << 24, "raw_ms": 4, "raw_inplace_ms": 3,
                       "hpcrep_numpy_ms": 5, "hpcrep_tf_ms": 8}],
            "latency_1kb": {"hpcrep_tf_ms": 0.25},
            "resnet50": {"bytes": 1e8, "hpcrep_tf_ms": 60, "raw_inplace_ms": 40}}}},
    }


def test_derive_and_render_then_rerender_from_json(tmp_path):
    from bench import report
    from hpcrep.cli import main

    data = fake_report()
    report.derive(data)
    runs = data["models"]["resnet50"]["runs"]
    assert runs["hpcrep"]["2"]["efficiency"] == pytest.approx(0.75)
    assert runs["nosync"]["2"]["efficiency"] == pytest.approx(1.0)
    assert data["models"]["resnet50"]["ratios"]["mwms"]["2"] == pytest.approx(1.25)
    assert data["projection"]["software_ms"] == 0.25
    paths = report.render(data, str(tmp_path))
    names = sorted(p.split("/")[-1] for p in paths)
    assert names == ["allreduce_bandwidth.png", "projection.png", "report.md",
                     "resnet50_scaling.png"]
    for p in paths:
        assert (tmp_path / p.split("/")[-1]).stat().st_size > 500
    md = (tmp_path / "report.md").read_text()
    assert "| hpcrep | 2 | 150 |" in md and "not importable" in md and "1.25x" in md
    (tmp_path / "report.md").unlink()
    (tmp_path / "projection.png").unlink()
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == md
    assert (tmp_path / "projection.png").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2
