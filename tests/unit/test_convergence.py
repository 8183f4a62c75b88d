"""What bench/convergence.py derives from the jobs' results: spreads and time to threshold."""

from __future__ import annotations

import pytest

from bench.convergence import stats, time_to_threshold


def test_stats_of_seeds_skip_missing_runs():
    s = stats([0.80, None, 0.84, 0.82])
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.82)
    assert s["std"] == pytest.approx(0.02) and (s["min"], s["max"]) == (0.80, 0.84)
    assert stats([None])["mean"] is None
    assert stats([1.5])["std"] == 0.0


def test_time_to_threshold_is_the_first_window_that_reaches_it():
    run = {"returns": [-1400, -900, -300, -500, -200, -150],
           "episode_seconds": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
           "episode_env_steps": [200, 400, 600, 800, 1000, 1200]}
    # Windows of 3: -866.7, -566.7, -333.3 (episode 5) is the first >= -400.
    assert time_to_threshold(run, -400.0, window=3) == {
        "episode": 5, "seconds": 5.0, "env_steps_per_actor": 1000}
    assert time_to_threshold(run, -100.0, window=3) is None
    assert time_to_threshold(run, -1400.0, window=1)["episode"] == 1


def test_option_reads_the_last_value_as_argparse_does():
    from bench.convergence import option

    args = ["--batch", "32", "--image-size", "16", "--batch=64", "--epochs", "3", "--epochs", "8"]
    assert option(args, "--batch", "1") == "64"
    assert option(args, "--epochs", "1") == "8"
    assert option(args, "--samples", "2000") == "2000"


def test_powersgd_claim_compares_compressed_with_uncompressed_at_equal_ranks(tmp_path,
                                                                             monkeypatch):
    """The powersgd experiment runs jobs.resnet at N ranks with and without --compression, one
    job per seed, and holds when PowerSGD's mean accuracy is at most --tolerance below."""
    import argparse

    from bench import convergence

    accuracy = {("none", 0): 0.900, ("none", 1): 0.904, ("powersgd:2", 0): 0.897,
                ("powersgd:2", 1): 0.899}
    calls = []

    def fake_run_job(module, ranks, job_args, out, label, timeout):
        kind = job_args[job_args.index("--compression") + 1]
        seed = int(job_args[job_args.index("--seed") + 1])
        calls.append((module, ranks, kind, seed, label))
        return {"label": label, "command": "x", "wall_seconds": 1.0,
                "accuracy": accuracy[(kind, seed)]}

    monkeypatch.setattr(convergence, "run_job", fake_run_job)
    args = argparse.Namespace(ranks=4, tolerance=0.005, powersgd_rank=2, resnet_args="",
                              timeout=60)
    result = convergence.run_powersgd(args, convergence.SCALES["small"], [0, 1], str(tmp_path))
    assert [c[:4] for c in calls] == [("jobs.resnet", 4, "none", 0), ("jobs.resnet", 4, "none", 1),
                                      ("jobs.resnet", 4, "powersgd:2", 0),
                                      ("jobs.resnet", 4, "powersgd:2", 1)]
    assert calls[2][4] == "powersgd-powersgd2-r4-s0"
    assert result["claim"]["gap_points"] == pytest.approx(-0.4)
    assert result["claim"]["passed"]
    accuracy[("powersgd:2", 1)] = 0.889  # mean 0.893: 0.9 points below
    assert not convergence.run_powersgd(args, convergence.SCALES["small"], [0, 1],
                                        str(tmp_path))["claim"]["passed"]
    md = convergence.render({"scale": "small", "command": "c", "created": "t", "seeds": [0, 1],
                             "ranks": [1, 4], "machine": {"cores": 2, "cpu": "x"},
                             "experiments": {"powersgd": result}})
    assert "- compression powersgd:2: test accuracy (%) 89.80" in md
    assert "- gap (PowerSGD - uncompressed): -0.40 points" in md
