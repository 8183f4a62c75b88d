"""Pooling repeated benchmark jobs (``hpcrep bench --repeats``): figures over all rounds of all
jobs, ratios only between variants timed in the same round of the same job, per-job medians,
failed self-checks, the order the jobs run in, and how the report shows them (one process, no
mpirun)."""

from __future__ import annotations

import pytest


def timing(items: float, round_ms: list, ok: bool = True, steps: int = 3) -> dict:
    """One job's timing of one variant, as bench.timing.time_rounds writes it."""
    from bench.timing import spread

    s = spread(round_ms)
    return {"step_ms": s["median"], "step_ms_min": s["min"], "step_ms_max": s["max"],
            "round_ms": list(round_ms), "throughput": items / s["median"] * 1e3,
            "throughput_min": items / s["max"] * 1e3, "throughput_max": items / s["min"] * 1e3,
            "items_per_step": items, "warmup_ms": [50.0, 40.0], "rounds": len(round_ms),
            "steps_per_round": steps, "step_times_ms": [float(x) for x in round_ms],
            "threads_per_rank": 1,
            "check": {"ok": ok, **({} if ok else {"weights": {"ok": False,
                                                               "detail": "weights differ"}})}}


def job(ok: bool = True, **round_ms: list) -> dict:
    """One job's runs, as bench.job.run_modes returns them."""
    from bench.job import split_communication

    return split_communication({mode: timing(8, ms, ok or mode != "mpi4py")
                                for mode, ms in round_ms.items()})


def test_a_figure_is_the_median_and_min_max_over_every_round_of_every_job():
    from bench.pooling import pool_jobs

    first = job(nosync=[10, 11, 12], hpcrep=[12, 13, 14])
    second = job(nosync=[20, 21, 22], hpcrep=[24, 25, 26])
    pooled = pool_jobs([first, second])
    hp = pooled["hpcrep"]
    assert hp["round_ms"] == [12, 13, 14, 24, 25, 26]            # job order, rounds in order
    assert (hp["step_ms"], hp["step_ms_min"], hp["step_ms_max"]) == (19.0, 12.0, 26.0)
    assert hp["throughput"] == pytest.approx(8 / 19.0 * 1e3)
    assert hp["throughput_min"] == pytest.approx(8 / 26 * 1e3)
    assert hp["throughput_max"] == pytest.approx(8 / 12 * 1e3)
    assert (hp["jobs"], hp["rounds"], hp["job_rounds"]) == (2, 6, [3, 3])
    assert hp["job_step_ms"] == [13.0, 25.0]                     # each job's own median
    assert hp["job_warmup_ms"] == [[50.0, 40.0], [50.0, 40.0]] and "warmup_ms" not in hp
    assert len(hp["step_times_ms"]) == 6 and hp["threads_per_rank"] == 1
    assert hp["comm_ms"] == pytest.approx(19.0 - 16.0)           # against the pooled no-sync
    # one job alone: its own figures, the range of its own rounds
    alone = pool_jobs([second])["hpcrep"]
    assert (alone["step_ms"], alone["step_ms_min"], alone["jobs"]) == (25.0, 24.0, 1)


def test_ratios_pair_rounds_of_the_same_job_and_keep_each_jobs_median():
    from bench.pooling import pool_jobs

    # hpcrep is 0.8 of no-sync in every round of job 1 and 0.9 in every round of job 2, while
    # the machine runs twice as slow in job 2: a ratio across jobs or of pooled medians differs
    first = job(nosync=[10, 10, 12], hpcrep=[12.5, 12.5, 15])
    second = job(nosync=[20, 22, 20], hpcrep=[20 / 0.9, 22 / 0.9, 20 / 0.9])
    vs = pool_jobs([first, second])["hpcrep"]["vs_nosync"]
    assert vs["min"] == pytest.approx(0.8) and vs["max"] == pytest.approx(0.9)
    assert vs["median"] == pytest.approx(0.85)
    assert vs["jobs"] == [pytest.approx(0.8), pytest.approx(0.9)]
    # the pooled range covers both jobs, where job 2's own range missed job 1 entirely
    assert pool_jobs([second])["hpcrep"]["vs_nosync"]["min"] == pytest.approx(0.9)


def test_raw_mpi_ratio_in_the_report_pairs_rounds_of_the_same_job():
    from bench import report

    first = job(nosync=[10, 10, 10], hpcrep=[12, 12, 12], mpi4py=[15, 15, 15])
    second = job(nosync=[20, 20, 20], hpcrep=[24, 24, 24], mpi4py=[24, 24, 24])
    from bench.pooling import pool_jobs

    pooled = pool_jobs([first, second])
    model = {"runs": {mode: {"2": r} for mode, r in pooled.items()}}
    ratio = report.peer_ratio(model, "mpi4py", "2")
    assert ratio["jobs"] == [pytest.approx(1.25), pytest.approx(1.0)]
    assert (ratio["min"], ratio["max"]) == (pytest.approx(1.0), pytest.approx(1.25))
    assert report.peer_ratio(model, "nosync", "2")["jobs"] == [pytest.approx(10 / 12)] * 2


def test_a_self_check_failed_in_any_job_marks_the_variant():
    from bench.pooling import pool_jobs

    good = job(nosync=[10, 10, 10], hpcrep=[12, 12, 12], mpi4py=[13, 13, 13])
    bad = job(ok=False, nosync=[10, 10, 10], hpcrep=[12, 12, 12], mpi4py=[13, 13, 13])
    assert bad["mpi4py"]["failed"] and not good["mpi4py"].get("failed")
    for jobs in ([good, bad], [bad, good]):
        pooled = pool_jobs(jobs)
        mpi = pooled["mpi4py"]
        assert mpi["failed"] and mpi["throughput"] is None and mpi["vs_nosync"] is None
        assert mpi["check"]["weights"]["detail"] == "weights differ"
        assert sorted(mpi["job_checks_ok"]) == [False, True]
        assert pooled["hpcrep"]["throughput"] is not None and not pooled["hpcrep"].get("failed")
    # D4PG's learner steps per second follow the pooled median, and go with the figures
    for runs in (good, bad):
        for r in runs.values():
            r["learner_steps_per_s"] = 1e3 / r["step_ms"] if r.get("step_ms") else None
    pooled = pool_jobs([good, bad])
    assert pooled["hpcrep"]["learner_steps_per_s"] == pytest.approx(1e3 / 12)
    assert pooled["mpi4py"]["learner_steps_per_s"] is None
    assert "failed" not in pool_jobs([good, good])["mpi4py"]


def test_only_repeats_of_the_same_job_are_pooled():
    from bench.pooling import job_medians, pool_jobs, pooled_ratio

    with pytest.raises(ValueError):
        pool_jobs([])
    with pytest.raises(ValueError, match="timed modes"):
        pool_jobs([job(nosync=[1, 1], hpcrep=[2, 2]), job(nosync=[1, 1], mpi4py=[2, 2])])
    other = job(nosync=[1, 1], hpcrep=[2, 2])
    other["hpcrep"]["steps_per_round"] = 20
    with pytest.raises(ValueError, match="steps per round"):
        pool_jobs([job(nosync=[1, 1], hpcrep=[2, 2]), other])
    assert job_medians([1.0, 3.0, 2.0, 10.0, 20.0], [3, 2]) == [2.0, 15.0]
    with pytest.raises(ValueError):
        job_medians([1.0, 2.0, 3.0], [2, 2])
    with pytest.raises(ValueError):
        job_medians([1.0, 2.0], [2, 0])
    assert "jobs" not in pooled_ratio([1.0, 2.0], [2.0, 2.0])
    assert pooled_ratio([1.0, 2.0], [2.0, 2.0], [1, 1])["jobs"] == [0.5, 1.0]


def test_repeats_run_interleaved_every_first_job_before_any_second():
    from bench.command import job_order

    plan = [(1, "main"), (1, "mwms"), (2, "main"), (2, "mwms")]
    order = job_order(plan, 2)
    assert order == [(1, e) for e in plan] + [(2, e) for e in plan]
    assert job_order(plan, 1) == [(1, e) for e in plan]
    with pytest.raises(ValueError):
        job_order(plan, 0)


def pooled_report() -> dict:
    """A report of two repeats of resnet50's main and MWMS jobs at 1 and 2 ranks."""
    from bench.pooling import pool_jobs
    from tests.unit.test_bench_report import fake_report

    data = fake_report()
    main = {n: pool_jobs([job(nosync=[80 * n, 80 * n, 90 * n], hpcrep=[80 * n, 90 * n, 100 * n],
                              mpi4py=[100 * n, 100 * n, 110 * n]),
                          job(nosync=[90 * n, 90 * n, 90 * n], hpcrep=[95 * n, 99 * n, 99 * n],
                              mpi4py=[120 * n, 120 * n, 120 * n])]) for n in (1, 2)}
    mwms = pool_jobs([job(mwms=[160, 160, 180], nosync=[80, 80, 90]),
                      job(mwms=[200, 200, 200], nosync=[80, 80, 80])])
    model = data["models"]["resnet50"]
    model["runs"] = {mode: {str(n): main[n][mode] for n in (1, 2)} for mode in main[1]}
    model["runs"]["mwms"] = {"2": mwms["mwms"]}
    model["peer_jobs"] = {"mwms": {"2": {"nosync": mwms["nosync"]}}}
    return data


def test_the_report_says_what_each_figure_pools_and_shows_the_per_job_medians():
    from bench import report, report_markdown

    data = pooled_report()
    report.derive(data)
    ratios = data["models"]["resnet50"]["ratios"]
    # hpcrep/no-sync per job: median of 160/160, 160/180, 180/200; then of 180/190, 180/198 x2
    assert ratios["nosync"]["2"]["jobs"] == [pytest.approx(0.9), pytest.approx(90 / 99)]
    # MWMS: job i of hpcrep's over job i of MWMS's, each against its own no-sync (0.5, 0.4)
    assert ratios["mwms"]["2"]["jobs"] == [pytest.approx(0.9 / 0.5),
                                           pytest.approx((90 / 99) / 0.4)]
    line = report.pooling_line(data)
    assert line.startswith("Each figure pools 2 jobs x 3 rounds: its median and [min-max] are "
                           "over all their rounds")
    assert "except" not in line and line in report.summary(data)
    md = report_markdown.markdown(data, [])
    assert line in md and "## Job-to-job drift" in md
    drift = md.split("## Job-to-job drift")[1].split("##")[0]
    assert [line.split(" | ")[1:3] for line in drift.splitlines() if line.startswith("| resnet")] \
        == [["1", "hpcrep/no-sync"], ["1", "hpcrep/raw MPI"], ["2", "hpcrep/no-sync"],
            ["2", "hpcrep/raw MPI"], ["2", "hpcrep/MWMS"]]
    assert f"| resnet50 | 2 | hpcrep/no-sync | {report.fmt_figure(ratios['nosync']['2'])} | " \
           f"0.90, 0.91 | 0.01 |" in md
    # the per-model table: jobs x rounds and each job's median step time
    assert "| hpcrep | main | 2 | 1 | 2 x 3 | " in md and " | 180, 198 | " in md
    # a run that lost a job (failed or timed out) is named with what it pooled
    data["models"]["resnet50"]["runs"]["mwms"]["2"] = \
        data["models"]["resnet50"]["runs"]["mwms"]["2"] | {"jobs": 1, "rounds": 3,
                                                            "job_rounds": [3]}
    line = report.pooling_line(data)
    assert line.endswith("except resnet50 2 ranks MWMS: 1 job x 3 rounds.")


def test_a_report_from_before_repeats_renders_without_pooling_lines():
    from bench import report, report_markdown
    from tests.unit.test_bench_report import fake_report

    data = fake_report()
    report.derive(data)
    assert report.pooling_line(data) == ""
    md = report_markdown.markdown(data, [])
    assert "Job-to-job drift" not in md and "Each figure pools" not in md
    assert "| hpcrep | main | 2 | 1 | - | " in md
