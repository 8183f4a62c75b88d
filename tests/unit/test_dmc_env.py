"""The DeepMind Control Suite adapter of jobs/d4pg (jobs/d4pg/dmc.py), when dm-control is
installed: an optional extra (setup.cfg 'dmc', installed by ``make bench-full``), so this test
skips without it, also under CI."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.d4pg.acting import make_env


def test_cartpole_swingup_behaves_like_a_gymnasium_env():
    pytest.importorskip("dm_control.suite", reason="optional extra 'dmc' (make bench-full)")
    env = make_env("dmc:cartpole-swingup", seed=0)
    assert env.observation_space.shape == (5,)  # position (3) + velocity (2)
    assert env.action_space.shape == (1,) and env.action_space.high[0] == 1.0
    o, _ = env.reset()
    assert o.shape == (5,) and o.dtype == np.float32
    total, steps, ended = 0.0, 0, False
    while not ended:
        o, r, terminated, truncated, _ = env.step(env.action_space.sample())
        assert 0.0 <= r <= 1.0 and not terminated
        total, steps, ended = total + r, steps + 1, truncated
    assert steps == 1000 and 0.0 < total < 1000.0  # the suite's time limit is a truncation
    again = make_env("dmc:cartpole-swingup", seed=0).reset()[0]
    np.testing.assert_array_equal(again, make_env("dmc:cartpole-swingup", seed=0).reset()[0])


def test_bad_task_names_say_what_is_expected():
    with pytest.raises(ValueError, match="DOMAIN-TASK"):
        make_env("dmc:cartpole")
