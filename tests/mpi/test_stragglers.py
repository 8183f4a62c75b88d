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


def test_the_compiled_path_names_a_late_rank_too(fresh, capfd, skip_missing):
    """Allreduces in a tf.function on the compiled path: its negotiation carries the same two
    entries, and a daemon thread feeds what it saw to the tracker once a second."""
    import tensorflow as tf

    import hpcrep.tensorflow as hvd
    from hpcrep.tensorflow import native

    hvd.init()
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    r, n = fresh
    slow = n - 1
    step = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="native.step"))
    before = native.stats(hc.communicator())[1]
    capfd.readouterr()
    for i in range(CALLS):
        if r == slow:
            time.sleep(LATE)
        assert step(tf.fill([4], float(i))).numpy()[0] == i * n
    assert native.stats(hc.communicator())[1] - before >= CALLS  # the compiled path reduced
    time.sleep(2.5)  # the poller takes the engine's observations once a second
    named = _named(capfd.readouterr().err)
    hc.barrier()
    if r != 0:
        assert named == []
        return
    assert len(named) == 1 and f"rank {slow} on " in named[0], named
