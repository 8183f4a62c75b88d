"""The benchmark's protocol and self-checks, their pure parts: interleaving order, settle
detection, spreads and per-round ratios, the self-check verdicts and tolerance, and the raw
MPI baseline's buffer layout (one process, no mpirun)."""

from __future__ import annotations

import numpy as np
import pytest


def test_interleaving_rotates_so_every_variant_takes_every_place():
    from bench.timing import interleaved_order

    order = interleaved_order(["hpcrep", "nosync", "mpi4py"], 6)
    assert order[0] == ["hpcrep", "nosync", "mpi4py"]
    assert order[1] == ["nosync", "mpi4py", "hpcrep"]
    assert all(sorted(r) == ["hpcrep", "mpi4py", "nosync"] for r in order)
    for place in range(3):
        assert sorted(r[place] for r in order) == ["hpcrep"] * 2 + ["mpi4py"] * 2 + ["nosync"] * 2
    assert interleaved_order(["a"], 2) == [["a"], ["a"]]
    with pytest.raises(ValueError):
        interleaved_order(["a"], 0)
    with pytest.raises(ValueError):
        interleaved_order([], 3)


def test_settle_detection_waits_for_two_windows_whose_medians_agree():
    from bench.timing import settled

    assert not settled([100.0] * 5, window=3)                  # fewer than two windows
    assert settled([100.0] * 6, window=3)
    # MWMS-like: first steps 654-809 ms, then 443-538
    slow_start = [809, 700, 654, 538, 470, 443]
    assert not settled(slow_start, window=3, tolerance=0.05)
    assert settled(slow_start + [460, 450, 470], window=3, tolerance=0.05)
    assert not settled([100, 100, 100, 106, 106, 106], window=3, tolerance=0.05)
    assert settled([100, 100, 100, 104, 104, 104], window=3, tolerance=0.05)
    assert settled([100, 300, 100, 100, 90, 100], window=3, tolerance=0.05)   # one outlier


def test_spread_and_round_ratios():
    from bench.job import round_ratio
    from bench.timing import spread

    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    with pytest.raises(ValueError):
        spread([])
    r = round_ratio([80.0, 80.0, 90.0], [100.0, 110.0, 120.0])   # nosync ms, variant ms
    assert r == {"median": pytest.approx(0.75), "min": pytest.approx(80 / 110),
                 "max": pytest.approx(0.8)}
    with pytest.raises(ValueError):
        round_ratio([1.0], [1.0, 2.0])


def test_split_communication_gives_vs_nosync_and_withholds_failed_figures():
    from bench.job import split_communication

    runs = split_communication({
        "nosync": {"step_ms": 10.0, "round_ms": [10.0, 10.0], "throughput": 1.0, "check": {
            "ok": True}},
        "hpcrep": {"step_ms": 12.5, "round_ms": [12.5, 12.5], "throughput": 0.8, "check": {
            "ok": True}},
        "mpi4py": {"step_ms": 5.0, "round_ms": [5.0, 5.0], "throughput": 2.0, "check": {
            "ok": False}}})
    assert runs["hpcrep"]["comm_ms"] == 2.5
    assert runs["hpcrep"]["vs_nosync"]["median"] == pytest.approx(0.8)
    assert runs["mpi4py"]["failed"] and runs["mpi4py"]["throughput"] is None
    assert runs["mpi4py"]["step_ms"] is None and runs["mpi4py"]["vs_nosync"] is None


def test_weights_verdict_needs_equal_digests_to_average_and_different_ones_without():
    from bench.selfcheck import weights_digest, weights_verdict

    a = weights_digest([np.ones((2, 2), np.float32), np.zeros(3, np.float32)])
    b = weights_digest([np.ones((2, 2), np.float32), np.array([0, 0, 1e-7], np.float32)])
    assert a != b and len(a) == 64
    assert weights_verdict([a, a], averages=True)["ok"]
    failed = weights_verdict([a, b], averages=True)
    assert not failed["ok"] and "did not average" in failed["detail"]
    assert weights_verdict([a, b], averages=False)["ok"]          # nosync: they must differ
    blind = weights_verdict([a, a], averages=False)
    assert not blind["ok"] and "cannot see" in blind["detail"]
    one = weights_verdict([a], averages=False)
    assert one["ok"] and not one["informative"]


def test_gradient_tolerance_covers_float32_averaging_and_nothing_coarser():
    from bench.selfcheck import average_tolerance, gradient_verdict, probe_coefficients

    n = 4
    cs = [probe_coefficients([(1000,), (3, 5)], r) for r in range(n)]
    assert not np.array_equal(cs[0][0], cs[1][0])                 # ranks differ
    mean = [np.mean([np.asarray(c[i], np.float64) for c in cs], axis=0) for i in range(2)]
    tol = [average_tolerance(np.sum([np.abs(np.asarray(c[i], np.float64)) for c in cs], axis=0),
                             n) for i in range(2)]
    # float32 averages computed the two usual ways: sum then divide, scale then sum
    post = [np.float32(np.sum([c[i] for c in cs], axis=0, dtype=np.float32)) / np.float32(n)
            for i in range(2)]
    pre = [np.sum([c[i] * np.float32(1 / n) for c in cs], axis=0, dtype=np.float32)
           for i in range(2)]
    for result in (post, pre):
        verdict = gradient_verdict(result, mean, tol, True, n, reference=post)
        assert verdict["ok"], verdict
        assert verdict["worst_over_tolerance"] <= 1.0
    # one rank's own gradient (no exchange), or an average missing a rank, is caught
    assert not gradient_verdict(cs[0], mean, tol, True, n)["ok"]
    partial = [np.mean([c[i] for c in cs[:3]], axis=0) for i in range(2)]
    assert not gradient_verdict(partial, mean, tol, True, n)["ok"]
    # an error of one float16 rounding (what fp16 compression would leave) is caught too
    half = [np.asarray(m, np.float16).astype(np.float32) for m in mean]
    assert not gradient_verdict(half, mean, tol, True, n)["ok"]
    # nosync passes by not being the mean
    assert gradient_verdict(cs[0], mean, tol, False, n)["ok"]
    assert not gradient_verdict(post, mean, tol, False, n)["ok"]
    assert gradient_verdict(cs[0], [c.astype(np.float64) for c in cs[0]], tol, False, 1)["ok"]


def test_raw_baseline_buffer_is_aligned_reused_and_scaled_in_one_pass():
    from bench.sync import ALIGN, RawAverager, aligned_empty, aligned_layout

    offsets, total = aligned_layout([3, 16, 1, 0, 17])
    assert offsets == [0, 16, 32, 48, 48] and total == 80
    assert all(o * 4 % ALIGN == 0 for o in offsets)
    for count in (1, 5, 1000):
        buf = aligned_empty(count)
        assert buf.ctypes.data % ALIGN == 0 and buf.size == count and buf.dtype == np.float32
    averager = RawAverager()
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(5, np.float32)]
    out = averager.average(arrays)                                 # one rank: the arrays
    for a, o in zip(arrays, out):
        np.testing.assert_array_equal(a, o)
        assert o.ctypes.data % ALIGN == 0 and o.shape == a.shape
    again = averager.average([a * 2 for a in arrays])
    assert again[0].ctypes.data == out[0].ctypes.data             # the same buffer, reused
    np.testing.assert_array_equal(again[1], 2 * np.ones(5))
