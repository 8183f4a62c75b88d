"""Straggler detection's arithmetic in one process: the encoding the agreement's MAX reduces, and
the window that decides when a rank is named (the MPI side: tests/mpi/test_stragglers.py)."""

import pytest

from hpcrep.comm import stragglers


def reduce_max(*ranks_waits):
    """What the agreement's MAX allreduce makes of each rank's two entries."""
    pairs = [stragglers.encode(wait, rank) for rank, wait in ranks_waits]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def test_the_max_names_the_rank_that_waited_least_and_how_late_it_was():
    # rank 2 arrived last: it waited 1 ms, rank 0 waited 42 ms for it
    rank, late = stragglers.decode(*reduce_max((0, 0.042), (1, 0.030), (2, 0.001), (3, 0.020)))
    assert rank == 2 and late == pytest.approx(0.041)
    rank, late = stragglers.decode(*reduce_max((0, 0.0), (1, 0.0)))
    assert (rank, late) == (1, 0.0)  # a tie: the highest rank, late by nothing
    assert stragglers.decode(stragglers.NONE, stragglers.NONE) is None  # nobody had a wait yet
    huge = stragglers.decode(*reduce_max((0, 10 ** 9), (5, 0.5)))
    assert huge[0] == 5 and huge[1] > 10 ** 6  # waits are capped, never wrap


def test_a_rank_is_named_once_when_last_often_enough_and_late_enough():
    t = stragglers.Tracker(window=10, share=0.8, min_late=0.02)
    warnings = [t.observe(3, 0.05, ("a", "a", "b", "b")) for _ in range(7)]
    warnings += [t.observe(1, 0.05) for _ in range(2)]
    assert warnings == [None] * 9  # the window is not full yet
    named = t.observe(3, 0.05, ("a", "a", "b", "b"))  # full: rank 3 last at 8 of 10
    assert named.startswith("hpcrep: straggler: rank 3 on b arrived last at 8 of the last 10 ")
    assert t.observe(3, 0.05) is None and t.observe(1, 0.05) is None  # once; rank 1 at 2 of 10


def test_share_and_lateness_thresholds():
    hosts = ("n1", "n1", "n2", "n2")
    t = stragglers.Tracker(window=10, share=0.8, min_late=0.02)
    out = [t.observe(3, 0.03, hosts) for _ in range(10)]
    assert out[:9] == [None] * 9
    assert out[9] == (
        "hpcrep: straggler: rank 3 on n2 arrived last at 10 of the last 10 collectives, 30 ms "
        "after the first rank (median of those); every rank waits for it. Look at that node "
        "(load, its link, throttling) or that rank's share of the work "
        "(HPCREP_STRAGGLER_WINDOW=0 turns this check off).")
    assert all(t.observe(3, 0.03, hosts) is None for _ in range(20))  # named once
    chance = stragglers.Tracker(window=10, share=0.8, min_late=0.02)
    assert all(chance.observe(r % 2, 0.05) is None for r in range(40))  # half each: by chance
    quick = stragglers.Tracker(window=10, share=0.8, min_late=0.02)
    assert all(quick.observe(2, 0.005) is None for _ in range(40))  # always last, but by 5 ms
    off = stragglers.Tracker(window=0, share=0.8, min_late=0.02)
    assert all(off.observe(2, 1.0) is None for _ in range(40))
