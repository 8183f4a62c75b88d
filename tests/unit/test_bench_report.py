"""The benchmark report: derived efficiencies and ratios, the projection, (re-)rendering."""

from __future__ import annotations

import json

import pytest

from bench.projection import allreduce_seconds, fusion_buffers, project


def test_ring_allreduce_cost_model():
    assert allreduce_seconds(1e9, 1, 10.0, 1e-6, 1e-3) == 0.0
    # p=4: 2*3/4 * 1 GB / 10 GB/s = 0.15 s, + 6 * 1 us per buffer, + 1 ms software
    assert allreduce_seconds(1e9, 4, 10.0, 1e-6, 1e-3) == pytest.approx(0.15 + 6e-6 + 1e-3)
    assert allreduce_seconds(1e9, 4, 10.0, 1e-6, 1e-3, messages=3) == pytest.approx(
        0.15 + 18e-6 + 1e-3)


def test_fusion_buffers_follow_the_threshold():
    assert fusion_buffers(102e6, 16 << 20) == 7           # ResNet-50's 102 MB in 16 MiB buffers
    assert fusion_buffers(1e3, 16 << 20) == 1
    assert fusion_buffers(1e6, 0, tensors=53) == 53       # packing off: one call per tensor


def test_projection_falls_with_ranks_and_overlap_row_only_when_measured():
    proj = project({"big": {"compute_ms": 100.0, "grad_bytes": 100e6, "grad_tensors": 200},
                    "tiny": {"compute_ms": 5.0, "grad_bytes": 1e4, "syncs_per_step": 2,
                             "overlap_fraction": 0.5}},
                   software_ms=0.3, memcpy_gbps=11.0, fusion_threshold=16 << 20)
    assert proj["effective_bandwidth_gbps"] == 11.0 and proj["capped_by_memcpy"]
    assert set(proj["models"]["big"]["rows"]) == {"fused"}       # no overlap measured: no row
    assert set(proj["models"]["tiny"]["rows"]) == {"fused", "measured_overlap"}
    for m in proj["models"].values():
        fused = m["rows"]["fused"]
        assert all(a >= b for a, b in zip(fused, fused[1:]))
        assert 0 < fused[-1] < 1
    tiny = proj["models"]["tiny"]["rows"]
    assert all(o > f for o, f in zip(tiny["measured_overlap"], tiny["fused"]))
    t = 0.3e-3 + 2 * 7 / 8 * 100e6 / 11e9 + 6 * 14 * 2e-6      # 6 buffers of 16 MiB
    assert proj["models"]["big"]["buffers"] == 6
    assert proj["models"]["big"]["rows"]["fused"][0] == pytest.approx(0.1 / (0.1 + t))


def test_projection_omits_what_this_run_did_not_measure():
    models = {"m": {"compute_ms": 10.0, "grad_bytes": 1e6}}
    assert "omitted" in project(models, software_ms=None, memcpy_gbps=11.0,
                                fusion_threshold=16 << 20)
    proj = project(models, software_ms=0.3, memcpy_gbps=None, fusion_threshold=16 << 20)
    assert not proj["capped_by_memcpy"] and proj["effective_bandwidth_gbps"] == 12.5
    assert proj["memcpy_gbps"] is None


def fake_report() -> dict:
    def run(thr, step, comm, threads=1):
        return {"throughput": thr, "step_ms": step, "comm_ms": comm, "compute_ms": step - comm,
                "comm_fraction": comm / step, "threads_per_rank": threads}
    return {
        "created": "2026-01-01T00:00:00", "quick": True, "ranks": [1, 2], "seconds": 1.0,
        "machine": {"host": "h", "cores": 2, "cpu": "c", "memory_gib": 1, "load_average": [0]},
        "versions": {"python": "3.11"}, "errors": [], "cores_per_rank": 1,
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
    assert data["projection"]["memcpy_gbps"] == 11.0
    paths = report.render(data, str(tmp_path))
    names = sorted(p.split("/")[-1] for p in paths)
    assert names == ["allreduce_bandwidth.png", "projection.png", "report.md",
                     "resnet50_scaling.png"]
    for p in paths:
        assert (tmp_path / p.split("/")[-1]).stat().st_size > 500
    md = (tmp_path / "report.md").read_text()
    assert "| hpcrep | 2 | 1 | 150 |" in md and "not importable" in md and "1.25x" in md
    assert "Cores per rank: 1 " in md and "| resnet50 | 2 | 0.75 | 0.75 | 1.25 |" in md
    (tmp_path / "report.md").unlink()
    (tmp_path / "projection.png").unlink()
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == md
    assert (tmp_path / "projection.png").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_efficiency_is_against_one_rank_at_the_same_cores_per_rank():
    from bench.report import weak_scaling_efficiency as eff

    assert eff(150.0, 2, 100.0, threads=1, base_threads=1) == pytest.approx(0.75)
    assert eff(300.0, 4, 100.0, threads=2, base_threads=2) == pytest.approx(0.75)
    assert eff(150.0, 2, 100.0, threads=1, base_threads=2) is None   # thread scaling mixed in
    assert eff(150.0, 2, 100.0, threads=None, base_threads=None) is None  # not recorded
    assert eff(150.0, 2, None, threads=1, base_threads=1) is None


def test_derive_pairs_horovod_with_hpcrep_of_its_own_job_and_checks_threads():
    from bench import report

    data = fake_report()
    model = data["models"]["resnet50"]
    model["runs"]["nosync"]["2"]["threads_per_rank"] = 2      # a run at other cores per rank
    model["runs"]["horovod"] = {"1": dict(model["runs"]["hpcrep"]["1"], throughput=90.0),
                                "2": dict(model["runs"]["hpcrep"]["2"], throughput=100.0)}
    model["paired"] = {"horovod": {"1": dict(model["runs"]["hpcrep"]["1"], throughput=95.0),
                                   "2": dict(model["runs"]["hpcrep"]["2"], throughput=120.0)}}
    data["peers"]["horovod"] = {"status": "importable", "version": "0.28.1", "python": "p"}
    report.derive(data)
    assert model["runs"]["nosync"]["2"]["efficiency"] is None
    assert model["runs"]["horovod"]["2"]["efficiency"] == pytest.approx(100 / 180)
    # hpcrep/Horovod from the paired job (120/100), not from the main job's hpcrep (150/100).
    assert model["ratios"]["horovod"] == {"1": pytest.approx(95 / 90), "2": pytest.approx(1.2)}
    rows = report.summary_rows(data)
    assert rows[0] == ["model", "ranks", "hpcrep efficiency", "hpcrep/no-sync", "hpcrep/Horovod",
                       "hpcrep/MWMS"]
    assert ["resnet50", "2", "0.75", "0.75", "1.20", "1.25"] == rows[-1]
    md = report.markdown(data, [])
    assert "| resnet50 | 2 | 120 | 100 | 1.20 |" in md
    assert "hpcrep/Horovod" in report.summary(data)


def test_without_the_allreduce_benchmark_the_projection_is_omitted_not_invented(tmp_path):
    from bench import report

    data = fake_report()
    del data["allreduce"]
    report.derive(data)
    assert "omitted" in data["projection"]
    paths = report.render(data, str(tmp_path))
    assert sorted(p.split("/")[-1] for p in paths) == ["report.md", "resnet50_scaling.png"]
    md = (tmp_path / "report.md").read_text()
    assert "Omitted: no measured software overhead" in md
    assert "capped by memcpy" not in md


def test_memcpy_not_measured_is_said_and_does_not_cap():
    from bench import report

    data = fake_report()
    data["allreduce"]["memcpy_gbps"] = 0.0       # what --no-allreduce-like partial runs left
    report.derive(data)
    md = report.markdown(data, [])
    assert "memcpy not measured in this run" in md and "capped by memcpy 0.0" not in md
    assert "No overlap row" in md and "measured overlap" not in md.split("No overlap row")[1]


def test_measured_overlap_gets_its_row():
    from bench import report

    data = fake_report()
    data["models"]["resnet50"]["overlap_fraction"] = 0.4
    report.derive(data)
    rows = data["projection"]["models"]["resnet50"]["rows"]
    assert set(rows) == {"fused", "measured_overlap"}
    assert "| resnet50 | 6 | measured overlap |" in report.markdown(data, [])


def test_a_report_from_an_older_version_is_rederived_before_rendering(tmp_path):
    from hpcrep.cli import main

    data = fake_report()
    data["projection"] = {"network": {}, "models": {"resnet50": {"no_overlap": [0.9],
                                                                 "overlap": [0.95]}}}
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert "rows" in saved["projection"]["models"]["resnet50"]
    assert saved["models"]["resnet50"]["runs"]["hpcrep"]["2"]["efficiency"] == pytest.approx(0.75)
