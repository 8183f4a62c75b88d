"""The hierarchical allreduce (node leaders) against the flat one, and the stall watchdog's
patience with a rank that is slow but alive. Across the nodes of tests/cluster (make
test-cluster) the hierarchical path is really taken; on one node it is the flat one."""

import time

import numpy as np

import hpcrep.comm as hc
from hpcrep.comm import collectives, watchdog


def test_hierarchical_path_is_taken_exactly_when_ranks_span_nodes_with_neighbours(monkeypatch):
    job = hc.world.communicator()
    spans = job.nodes > 1 and job.widest_node > 1
    monkeypatch.setenv("HPCREP_HIERARCHICAL_ALLREDUCE", "1")
    assert collectives.hierarchical(job) == spans
    monkeypatch.setenv("HPCREP_HIERARCHICAL_ALLREDUCE", "0")
    assert not collectives.hierarchical(job)


def test_hierarchical_and_flat_allreduce_agree(monkeypatch, world):
    r, n = world
    rng = np.random.default_rng(100 + r)
    ints = rng.integers(-1000, 1000, size=(3, 257), dtype=np.int64)
    floats = rng.standard_normal((5000,)).astype(np.float32)
    halves = rng.standard_normal((77,)).astype(np.float16)
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("HPCREP_HIERARCHICAL_ALLREDUCE", setting)
        results[setting] = hc.grouped_allreduce([ints, floats, halves], op=hc.Sum)
        maxed = hc.allreduce(floats, op=hc.Max)
        np.testing.assert_array_equal(maxed, np.max(hc.allgather(floats[None]), axis=0))
    everyone = hc.allgather_object([a.tobytes() for a in results["1"]])
    assert all(e == everyone[0] for e in everyone), "ranks hold different hierarchical results"
    expected = sum(np.random.default_rng(100 + k).integers(-1000, 1000, size=(3, 257),
                                                           dtype=np.int64) for k in range(n))
    np.testing.assert_array_equal(results["1"][0], expected)
    np.testing.assert_array_equal(results["0"][0], expected)
    np.testing.assert_allclose(results["1"][1], results["0"][1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results["1"][2].astype(np.float32),
                               results["0"][2].astype(np.float32), rtol=1e-2, atol=1e-2)


def test_a_slow_rank_is_not_killed_before_the_stall_timeout(monkeypatch, world, capfd):
    # Rank 0 computes for 4.5 s before the collective; the others wait in it with a 6 s timeout.
    # They warn at 3 s (the watchdog looks once a second) but must not abort: the result arrives.
    r, n = world
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", "6")
    if r == 0:
        time.sleep(4.5)
    total = hc.allreduce(np.array([r + 1.0]), op=hc.Sum, name="slow.rank")
    assert total[0] == n * (n + 1) / 2
    if n > 1 and r != 0:
        # The warning shows the watchdog saw the wait; no wall-clock assert (a rank descheduled
        # on a loaded machine would measure its own wait short).
        assert "warning: collective allreduce of 'slow.rank'" in capfd.readouterr().err
    assert watchdog.stall_timeout() == 6
