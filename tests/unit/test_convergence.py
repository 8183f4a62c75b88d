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
