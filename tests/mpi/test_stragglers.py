"""A rank that arrives late at every collective is named on stderr by rank 0, once, with its host
and how late it is; without a late rank nobody is named (hpcrep/comm/stragglers.py)."""

import time

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import stragglers

CALLS, WINDOW, LATE = 30, 20, 0.06


@pytest.fixture
def fresh(world, monkeypatch):
    if world[1] < 2:
        pytest.skip("a straggler needs at least 2 ranks (this run has 1)")
    monkeypatch.setattr(stragglers, "_trackers", {})
    monkeypatch.setattr(stragglers, "_last_wait", {})
    monkeypatch.setenv("HPCREP_STRAGGLER_WINDOW", str(WINDOW))
    monkeypatch.setenv("HPCREP_STRAGGLER_SHARE", "0.8")
    monkeypatch.setenv("HPCREP_STRAGGLER_MIN_LATE", "0.02")
    hc.barrier()
    return world


def _named(err):
    return [line for line in err.splitlines() if "hpcrep: straggler:" in line]


def test_a_rank_late_at_every_collective_is_named_once_by_rank_0(fresh, capfd):
    r, n = fresh
    slow = n - 1
    capfd.readouterr()
    for i in range(CALLS):
        if r == slow:
            time.sleep(LATE)  # extra work on this rank only
        total = hc.allreduce(np.full(4, float(i)), hc.Sum, name="step")
        assert total[0] == i * n
    named = _named(capfd.readouterr().err)
    if r != 0:
        assert named == []  # rank 0 speaks for the job
        return
    assert len(named) == 1, named
    late = float(named[0].split(" ms after")[0].rsplit(", ", 1)[1])
    assert f"rank {slow} on " in named[0] and "of the last 20 collectives" in named[0], named[0]
    assert 0.5 * 1e3 * LATE <= late <= 4 * 1e3 * LATE, named[0]


def test_ranks_in_step_are_not_named(fresh, capfd):
    capfd.readouterr()
    for i in range(CALLS):
        hc.allreduce(np.full(4, float(i)), hc.Sum, name="step")
    assert _named(capfd.readouterr().err) == []
