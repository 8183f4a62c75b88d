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


def run(items: float, round_ms: list, threads: int = 1) -> dict:
    """A job's timing of one variant, as bench.timing.time_rounds writes it."""
    from bench.timing import spread

    s = spread(round_ms)
    return {"step_ms": s["median"], "step_ms_min": s["min"], "step_ms_max": s["max"],
            "round_ms": list(round_ms), "throughput": items / s["median"] * 1e3,
            "throughput_min": items / s["max"] * 1e3, "throughput_max": items / s["min"] * 1e3,
            "threads_per_rank": threads, "check": {"ok": True}}


def job(runs: dict) -> dict:
    from bench.job import split_communication

    return split_communication(runs)


def fake_report() -> dict:
    main1 = job({"hpcrep": run(8, [80, 80, 80]), "nosync": run(8, [80, 80, 80]),
                 "mpi4py": run(8, [100, 100, 100])})
    main2 = job({"hpcrep": run(16, [100, 110, 120]), "nosync": run(16, [80, 80, 90]),
                 "mpi4py": run(16, [125, 132, 150])})
    mwms2 = job({"mwms": run(16, [160, 160, 180]), "nosync": run(16, [80, 80, 90])})
    runs = {mode: {"1": main1[mode], "2": main2[mode]} for mode in main1}
    runs["mwms"] = {"2": mwms2["mwms"]}
    return {
        "created": "2026-01-01T00:00:00", "quick": True, "ranks": [1, 2], "seconds": 1.0,
        "machine": {"host": "h", "cores": 2, "cpu": "c", "memory_gib": 1, "load_average": [0]},
        "load": {"start": {"load_average": [0.1, 0.1, 0.1], "busy_fraction": 0.02},
                 "end": {"load_average": [1.9, 1.0, 0.5], "busy_fraction": 0.03}},
        "versions": {"python": "3.11"}, "errors": [], "cores_per_rank": 1,
        "peers": {"horovod": {"status": "not importable", "error": "ModuleNotFoundError"}},
        "models": {"resnet50": {"unit": "images/s", "grad_bytes": 1e8, "grad_tensors": 214,
                                "runs": runs, "mwms": {"bytes_per_pack": 16 << 20,
                                                       "implementation": "AUTO (RING on CPU)",
                                                       "transport": "gRPC over localhost TCP"},
                                "peer_jobs": {"mwms": {"2": {"nosync": mwms2["nosync"]}}}}},
        "allreduce": {"memcpy_gbps": 11.0, "runs": {"2": {
            "sizes": [{"bytes": 4096, "raw_ms": 0.02, "raw_inplace_ms": 0.02,
                       "hpcrep_numpy_ms": 0.05, "hpcrep_tf_ms": 0.3},
                      {"bytes": 1 << 24, "raw_ms": 4, "raw_inplace_ms": 3,
                       "hpcrep_numpy_ms": 5, "hpcrep_tf_ms": 8}],
            "latency_1kb": {"hpcrep_tf_ms": 0.25},
            "resnet50": {"bytes": 1e8, "hpcrep_tf_ms": 60, "raw_inplace_ms": 40}}}},
    }


def test_derive_and_render_then_rerender_from_json(tmp_path):
    from bench import report, report_markdown
    from hpcrep.cli import main

    data = fake_report()
    report.derive(data)
    model = data["models"]["resnet50"]
    runs = model["runs"]
    assert runs["hpcrep"]["2"]["efficiency"] == pytest.approx(16 / 110 / (2 * 8 / 80))
    # hpcrep/no-sync and hpcrep/raw MPI: per-round ratios in the same job
    # rounds: 80/100, 80/110, 90/120
    assert model["ratios"]["nosync"]["2"] == {"median": pytest.approx(0.75),
                                              "min": pytest.approx(80 / 110),
                                              "max": pytest.approx(0.8)}
    # rounds: 125/100, 132/110, 150/120
    assert model["ratios"]["mpi4py"]["2"] == {"median": pytest.approx(1.25),
                                              "min": pytest.approx(1.2),
                                              "max": pytest.approx(1.25)}
    # hpcrep/MWMS: each against its own job's no-sync (MWMS: 0.5 in every round), spreads
    # combined outward
    assert model["ratios"]["mwms"]["2"] == {"median": pytest.approx(1.5),
                                            "min": pytest.approx((80 / 110) / 0.5),
                                            "max": pytest.approx(1.6)}
    assert data["projection"]["software_ms"] == 0.25
    assert data["projection"]["memcpy_gbps"] == 11.0
    paths = report_markdown.render(data, str(tmp_path))
    names = sorted(p.split("/")[-1] for p in paths)
    assert names == ["allreduce_bandwidth.png", "projection.png", "report.md",
                     "resnet50_scaling.png"]
    for p in paths:
        assert (tmp_path / p.split("/")[-1]).stat().st_size > 500
    md = (tmp_path / "report.md").read_text()
    assert "not importable" in md and "Cores per rank: 1 " in md
    assert "| model | ranks | hpcrep/no-sync | hpcrep/raw MPI | hpcrep/MWMS |" in md
    assert "| resnet50 | 2 | 0.75 [0.72-0.80] | 1.25 [1.20-1.25] | 1.5 [1.4-1.6] |" in md
    assert "bytes_per_pack=16 MiB" in md and "gRPC over localhost TCP" in md
    assert "WARNING" not in md                       # the load stayed low
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


def test_summary_leads_with_no_sync_and_compares_horovod_through_its_own_job():
    from bench import report, report_markdown

    data = fake_report()
    model = data["models"]["resnet50"]
    hv = job({"horovod": run(16, [100, 100, 100]), "nosync": run(16, [100, 100, 100])})
    model["runs"]["horovod"] = {"2": hv["horovod"]}
    model["peer_jobs"]["horovod"] = {"2": {"nosync": hv["nosync"]}}
    model["horovod"] = {"HOROVOD_FUSION_THRESHOLD": "16777216", "HOROVOD_CYCLE_TIME": "1"}
    data["peers"]["horovod"] = {"status": "importable", "version": "0.28.1", "python": "p"}
    report.derive(data)
    # Horovod's job ran at no-sync speed (no slowdown of its own): hpcrep/Horovod is hpcrep's
    # own hpcrep/no-sync, not hpcrep's throughput over Horovod's raw throughput (0.91).
    assert model["ratios"]["horovod"]["2"]["median"] == pytest.approx(0.75)
    rows = report.summary_rows(data)
    assert rows[0] == ["model", "ranks", "hpcrep/no-sync", "hpcrep/raw MPI", "hpcrep/Horovod",
                       "hpcrep/MWMS", "hpcrep efficiency vs 1 rank", "self-checks"]
    assert rows[-1][4] == "0.75 [0.72-0.80]" and rows[-1][-1] == "ok"
    md = report_markdown.markdown(data, [])
    assert "HOROVOD_FUSION_THRESHOLD=16777216" in md and "DistributedGradientTape" in md
    assert "grouped_allreduce` vs" not in md
    assert "| resnet50 | 2 | 0.75 [0.72-0.80] | 1 | 0.75 [0.72-0.80] |" in md
    assert "hpcrep/Horovod" in report.summary(data)


def test_a_variant_that_failed_its_self_check_is_marked_not_timed():
    from bench import report, report_markdown

    data = fake_report()
    bad = dict(data["models"]["resnet50"]["runs"]["mpi4py"]["2"])
    bad["check"] = {"ok": False, "weights": {"ok": False, "detail": "weights differ"}}
    main2 = job({"hpcrep": data["models"]["resnet50"]["runs"]["hpcrep"]["2"],
                 "nosync": data["models"]["resnet50"]["runs"]["nosync"]["2"], "mpi4py": bad})
    assert main2["mpi4py"]["failed"] and main2["mpi4py"]["throughput"] is None
    assert main2["hpcrep"]["throughput"] is not None
    data["models"]["resnet50"]["runs"]["mpi4py"]["2"] = main2["mpi4py"]
    report.derive(data)
    assert "2" not in data["models"]["resnet50"]["ratios"]["mpi4py"]   # no ratio from it
    rows = report.summary_rows(data)
    assert rows[-1][-1] == "FAILED: raw MPI" and rows[-1][3] == "-"
    md = report_markdown.markdown(data, [])
    assert "**FAILED**: weights differ" in md


def test_high_load_is_warned_about():
    from bench import report, report_markdown

    data = fake_report()
    report.derive(data)
    assert report.load_warning(data) is None
    data["load"]["start"] = {"load_average": [4.2, 3.0, 2.0], "busy_fraction": 0.9}
    assert "before" in report.load_warning(data)
    assert "WARNING" in report_markdown.markdown(data, []) and "WARNING" in report.summary(data)
    data["load"]["start"]["load_average"] = [0.1] * 3
    data["load"]["start"]["busy_fraction"] = 0.05
    data["load"]["end"] = {"load_average": [3.0] * 3, "busy_fraction": 0.05}
    assert report.load_warning(data) is None     # the end's average counts the run itself
    # An average left by work that ended before the run, cores idle while sampled: no warning.
    data["load"]["start"] = {"load_average": [1.13, 2.35, 4.06], "busy_fraction": 0.0}
    assert report.load_warning(data) is None
    data["load"]["start"]["busy_fraction"] = None  # no /proc/stat: the average decides
    assert "before" in report.load_warning(data)


def test_spread_formatting_keeps_only_the_digits_the_spread_allows():
    from bench.report import fmt_figure, fmt_spread

    assert fmt_spread(155.0, 124.0, 186.0) == "160 [120-190]"      # +-20%: two digits
    assert fmt_spread(1.0, 0.985, 1.015) == "1.00 [0.98-1.02]"
    assert fmt_spread(0.7273, 0.7273, 0.8) == "0.73 [0.72-0.80]"
    assert fmt_spread(154.2, 153.9, 154.6) == "154.2 [153.9-154.6]"
    assert fmt_spread(300.0, 43.0, 400.0) == "300 [40-400]"         # the min keeps a digit
    assert fmt_spread(0.156, 0.093, 0.219) == "0.16 [0.09-0.22]"
    assert fmt_spread(2.5, 2.5, 2.5) == "2.5"                          # no spread: 3 digits
    assert fmt_spread(1234.5) == "1.23e+03"
    assert fmt_spread(None) == "-" and fmt_figure(None) == "-"
    assert fmt_figure({"median": 1.0, "min": 0.9, "max": 1.1}) == "1.0 [0.9-1.1]"


def test_the_model_is_checked_at_the_measured_points():
    from bench import report, report_markdown

    data = fake_report()
    report.derive(data)
    checked = data["projection"]["checked"]
    assert checked["network"]["name"] == "one node, shared memory"
    assert checked["network"]["bandwidth_gbps"] == 11.0
    # t_c = 80 ms; one exchange of 1e8 B on 2 ranks: 0.25 ms + 1e8 / 11e9 s + 6 buffers x 2 x 1 us
    t = 0.25e-3 + 1e8 / 11e9 + 6 * 2 * 1e-6
    assert checked["models"]["resnet50"]["2"] == pytest.approx(0.08 / (0.08 + t))
    md = report_markdown.markdown(data, [])
    assert "## The model against this run's measurements" in md and "is a model" in md
    assert f"| resnet50 | 2 | {0.08 / (0.08 + t):.2f} | 0.73 | 0.75 [0.72-0.80] |" in md
    link = report.check_points({"m": {"compute_ms": 10.0, "grad_bytes": 1e6}}, 0.1, 11.0,
                               16 << 20, [1, 2, 4], {"nodes": 2, "link": "2gbit"})
    assert link["network"]["bandwidth_gbps"] == 0.25 and set(link["models"]["m"]) == {"2", "4"}
    assert "omitted" in report.check_points({}, None, 11.0, 16 << 20, [2])


def test_without_the_allreduce_benchmark_the_projection_is_omitted_not_invented(tmp_path):
    from bench import report, report_markdown

    data = fake_report()
    del data["allreduce"]
    report.derive(data)
    assert "omitted" in data["projection"]
    paths = report_markdown.render(data, str(tmp_path))
    assert sorted(p.split("/")[-1] for p in paths) == ["report.md", "resnet50_scaling.png"]
    md = (tmp_path / "report.md").read_text()
    assert "Omitted: no measured software overhead" in md
    assert "capped by memcpy" not in md


def test_memcpy_not_measured_is_said_and_does_not_cap():
    from bench import report, report_markdown

    data = fake_report()
    data["allreduce"]["memcpy_gbps"] = 0.0       # what --no-allreduce-like partial runs left
    report.derive(data)
    md = report_markdown.markdown(data, [])
    assert "memcpy not measured in this run" in md and "capped by memcpy 0.0" not in md
    assert "No overlap row" in md and "measured overlap" not in md.split("No overlap row")[1]


def test_measured_overlap_gets_its_row():
    from bench import report, report_markdown

    data = fake_report()
    data["models"]["resnet50"]["overlap_fraction"] = 0.4
    report.derive(data)
    rows = data["projection"]["models"]["resnet50"]["rows"]
    assert set(rows) == {"fused", "measured_overlap"}
    assert "| resnet50 | 6 | measured overlap |" in report_markdown.markdown(data, [])


def test_hpcreps_timeline_gives_the_columns_and_the_projections_overlap_row():
    from bench import report, report_markdown

    data = fake_report()
    assert report.measured_overlap(data["models"]["resnet50"]) is None
    report.derive(data)
    assert "measured_overlap" not in data["projection"]["models"]["resnet50"]["rows"]
    data = fake_report()
    hpcrep2 = data["models"]["resnet50"]["runs"]["hpcrep"]["2"]
    hpcrep2["trace"] = {"jobs": 2, "steps": 6, "step_ms": 110.0, "exposed_ms": 12.5,
                        "exposed_ms_min": 11.0, "exposed_ms_max": 14.0, "overlap": 0.85,
                        "compute_ms": 97.5, "mpi_ms": 30.0, "bytes": 1e8}
    report.derive(data)
    model = data["models"]["resnet50"]
    assert model["overlap_fraction"] == 0.85 and model["overlap_measured_at"] == 2
    proj = data["projection"]["models"]["resnet50"]
    fused, hidden = proj["rows"]["fused"], proj["rows"]["measured_overlap"]
    assert all(h > f for f, h in zip(fused, hidden))  # hiding 85 % of comm lifts efficiency
    md = report_markdown.markdown(data, [])
    assert "exposed comm ms (timeline) | overlap | self-check |" in md
    assert "| 12.5 [11.0-14.0] | 0.85 | ok" in md
    assert "overlap fraction of hpcrep's timeline at 2 ranks for resnet50" in md
    two_exchanges = fake_report()
    two_exchanges["models"]["resnet50"]["syncs_per_step"] = 2  # as SN-GAN and D4PG
    two_exchanges["models"]["resnet50"]["runs"]["hpcrep"]["2"]["trace"] = hpcrep2["trace"]
    report.derive(two_exchanges)
    assert "measured_overlap" not in two_exchanges["projection"]["models"]["resnet50"]["rows"]
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| variant | job |"))
    table = lines[header:lines.index("", header)]
    assert len(table) == 10  # header, rule, 8 rows: each with the header's columns
    assert {line.count("|") for line in table} == {table[0].count("|")}


def test_traces_of_repeated_jobs_pool_to_medians_and_failed_modes_lose_theirs():
    from bench.exposed import pool_traces, trace_path
    from bench.pooling import pool_jobs

    assert trace_path("out/jobs/resnet50-2-hpcrep.json") == "out/jobs/resnet50-2-hpcrep.trace.json"
    assert trace_path(None) is None and pool_traces([None, {}]) is None
    a = {"steps": 3, "exposed_ms": 10.0, "overlap": 0.5, "step_ms": 100.0, "file": "a"}
    b = {"steps": 3, "exposed_ms": 20.0, "overlap": None, "step_ms": 120.0, "file": "b"}
    c = {"steps": 3, "exposed_ms": 40.0, "overlap": 0.7, "step_ms": 110.0, "file": "c"}
    pooled = pool_traces([a, None, b, c])
    assert pooled["jobs"] == 3 and pooled["steps"] == 9 and pooled["files"] == ["a", "b", "c"]
    assert pooled["exposed_ms"] == 20.0 and pooled["exposed_ms_min"] == 10.0
    assert pooled["exposed_ms_max"] == 40.0 and pooled["overlap"] == pytest.approx(0.6)
    one = {"hpcrep": dict(run(8, [90, 95]), trace=a), "nosync": run(8, [80, 80])}
    two = {"hpcrep": dict(run(8, [92, 97]), trace=c), "nosync": run(8, [80, 82])}
    runs = pool_jobs([one, two])
    assert runs["hpcrep"]["trace"]["exposed_ms"] == 25.0 and "trace" not in runs["nosync"]
    bad = dict(run(8, [92, 97]), trace=c)
    bad["check"] = {"ok": False}
    runs = pool_jobs([one, {"hpcrep": bad, "nosync": run(8, [80, 82])}])
    assert runs["hpcrep"]["trace"] is None  # a variant that failed its check shows no figures


def test_a_report_from_an_older_version_is_rederived_before_rendering(tmp_path):
    from hpcrep.cli import main

    data = fake_report()
    data["projection"] = {"network": {}, "models": {"resnet50": {"no_overlap": [0.9],
                                                                 "overlap": [0.95]}}}
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert main(["report", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "report.json").read_text())
    assert "rows" in saved["projection"]["models"]["resnet50"]
    assert saved["models"]["resnet50"]["runs"]["hpcrep"]["2"]["efficiency"] == pytest.approx(
        16 / 110 / (2 * 8 / 80))


def test_idle_time_is_estimated_from_the_jobs_cpu_seconds():
    from bench import report, report_markdown

    data = fake_report()
    assert report.idle_seconds(data) is None
    data["models"]["resnet50"]["jobs"] = {"1/hpcrep": {"cpu_seconds": 100.0},
                                          "2/hpcrep": {"cpu_seconds": 300.0}}
    data["allreduce_cpu_seconds"] = 40.0
    assert report.idle_seconds(data) == pytest.approx(100 + 150 + 20)
    report.derive(data)
    assert "270 CPU s per rank" in report_markdown.markdown(data, [])


def test_the_sharded_model_figures_get_their_section():
    from bench import memory, report, report_markdown

    timing = {"step_ms": 300.0, "step_ms_min": 290.0, "step_ms_max": 320.0}
    data = fake_report()
    data["memory"] = {
        "tensor_parallel": {
            str(k): {"ranks": 2, "ranks_per_replica": k, "replicas": 2 // k,
                     "first_loss": 0.693, "last_loss": 0.5, "median_step_s": 0.0187,
                     "parameter_bytes_per_rank": [6467588 // k] * 2,
                     "parameter_bytes_unsharded": 6467588,
                     "slot_bytes_per_rank": [6467588 // k] * 2,
                     "peak_rss_bytes_per_rank": [620e6, 630e6]} for k in (1, 2)},
        "zero": {"results": {"2": {
            "timing": {"plain": timing, "zero": dict(timing, step_ms=310.0)},
            "timing_bytes": [{"plain": {"params": 100 << 20, "slots": 200 << 20, "shard": 0},
                              "zero": {"params": 100 << 20, "slots": 100 << 20,
                                       "shard": 50 << 20}}] * 2,
            "rss": {"plain": 1500.0, "zero": 1400.0}}}}}
    report.derive(data)
    md = report_markdown.markdown(data, [])
    assert "## Models larger than one rank" in md
    assert "| 1 | 2 | 6.5 | 6.5 | 630.0 | 18.7 | 0.693 -> 0.500 |" in md
    assert "| 2 | 1 | 3.2 | 3.2 | 630.0 | 18.7 | 0.693 -> 0.500 |" in md
    assert "| 2 | zero | 310 [290, 320] | 100.0 | 100.0 | 50.0 | 1400 |" in md
    assert memory.markdown(None) == [] and "Models larger" not in report_markdown.markdown(
        fake_report() | {"projection": data["projection"]}, [])
