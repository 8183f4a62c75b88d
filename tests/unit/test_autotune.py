"""The autotuner's search (hpcrep.comm.autotune.Search), fed step periods from a known cost
grid: it must find the grid's best cell, say so, and search again when step times drift."""

import pytest

from hpcrep.comm.autotune import CHUNK_CHOICES, FUSION_CHOICES, MIB, Decision, Search, Setting

START = Setting(16 * MIB, 4 * MIB)


def cost(setting: Setting) -> float:
    """A grid shaped like the 1 Gb/s sweep: the piece size matters most, 1 MiB is best, and a
    64 MiB threshold beats the others by a little."""
    by_chunk = {1 * MIB: 0.870, 4 * MIB: 1.25, 16 * MIB: 1.60, 0: 1.80}[setting.chunk]
    return by_chunk - (0.01 if setting.fusion == 64 * MIB else 0.0)


def drive(search: Search, periods, decision: Decision, limit: int = 1000) -> tuple[Decision, int]:
    """Run the search as StepTuner does: one period per step, a decision every decision.steps
    steps; return the last decision and the steps taken, once settled (or after ``limit``)."""
    steps = 0
    while steps < limit:
        for _ in range(decision.steps):
            search.observe(periods(decision.setting, steps))
            steps += 1
        decision = search.decide()
        if search.settled:
            return decision, steps
    return decision, steps


def test_search_finds_the_best_cell_and_logs_each_setting():
    lines = []
    search = Search(START, warmup=2, measure=5, window=20, log=lines.append)
    first = search.first()
    assert first == Decision(START, 7)
    decision, steps = drive(search, lambda s, _: cost(s), first)
    assert decision.setting == Setting(64 * MIB, 1 * MIB) == search.best[0]
    assert search.best[1] == pytest.approx(0.860)
    # start, 3 other piece sizes, 2 larger thresholds, 3 other piece sizes at 64 MiB: 9 x 7 steps
    assert len(search.trials) == 9 and steps == 63 and search.settled_at == 63
    assert {t.setting for t in search.trials} <= {Setting(f, c) for f in FUSION_CHOICES
                                                  for c in CHUNK_CHOICES}
    assert len(lines) == 10 and "settled on fusion 64 MiB, pieces 1 MiB" in lines[-1]
    assert "1.45x the search's starting setting (fusion 16 MiB, pieces 4 MiB: 1250.0 ms)" \
        in lines[-1]
    assert lines[0] == "step 7: fusion 16 MiB, pieces 4 MiB: 1250.0 ms per step"


def test_thresholds_below_the_traced_one_are_not_tried():
    """The buckets are traced at the starting threshold: the engine can fuse them, not cut
    them, so a smaller threshold would be timed as the starting one."""
    search = Search(Setting(64 * MIB, 4 * MIB), warmup=0, measure=1)
    drive(search, lambda s, _: cost(s), search.first())
    assert {t.setting.fusion for t in search.trials} == {64 * MIB, 256 * MIB}
    small = Search(Setting(1 * MIB, 4 * MIB), warmup=0, measure=1)
    drive(small, lambda s, _: cost(s), small.first())
    assert {t.setting.fusion for t in small.trials} == set(FUSION_CHOICES)


@pytest.mark.parametrize("fp16_ms, chosen", [(0.7, True), (0.9, False)])
def test_float16_wire_is_a_last_phase_only_where_allowed(fp16_ms, chosen):
    def periods(setting, _):
        return fp16_ms if setting.fp16 else cost(setting)

    plain = Search(START, warmup=0, measure=1)
    drive(plain, periods, plain.first())
    assert not any(t.setting.fp16 for t in plain.trials)
    allowed = Search(START, warmup=0, measure=1, allow_fp16=True)
    drive(allowed, periods, allowed.first())
    assert allowed.trials[-1].setting == Setting(64 * MIB, 1 * MIB, True)
    assert allowed.best[0].fp16 is chosen
    assert str(Setting(16 * MIB, 0, True)) == \
        "fusion 16 MiB, pieces whole buffer, float16 on the wire"


def test_warmup_steps_are_not_scored():
    """The first steps after a change are slow (retracing, caches): they must not count."""
    search = Search(START, warmup=2, measure=3)

    def periods(setting, step):
        return 50.0 if step % 5 < 2 else cost(setting)  # each setting's first 2 steps are slow

    drive(search, periods, search.first())
    assert all(t.score < 2.0 for t in search.trials)
    assert search.best[0] == Setting(64 * MIB, 1 * MIB)


def test_settled_search_searches_again_after_two_slow_windows_only():
    lines = []
    search = Search(START, warmup=1, measure=3, window=10, drift=0.15, log=lines.append)
    decision, _ = drive(search, lambda s, _: cost(s), search.first())
    best = search.best[0]
    for _ in range(10):  # one slow window (a checkpoint, an evaluation): no new search
        search.observe(cost(best) * 3)
    assert search.decide() == Decision(best, 10) and search.searches == 1
    for _ in range(10):
        search.observe(cost(best))
    assert search.decide() == Decision(best, 10)
    for _window in range(2):  # the network got slower for good: two slow windows
        for _ in range(10):
            search.observe(cost(best) * 1.5)
        decision = search.decide()
    assert search.searches == 2 and not search.settled
    assert decision == Decision(best, 4)  # the new search starts from the setting it had
    assert "drifted from 860.0 to 1290.0 ms: searching again" in lines[-1]


def test_frozen_search_keeps_its_setting():
    search = Search(START, warmup=0, measure=1, window=5)
    search.frozen = True
    search.observe(1.0)
    assert search.decide() == Decision(START, 5) and search.trials == []


@pytest.mark.parametrize("kwargs", [{"measure": 0}, {"warmup": -1}, {"window": 0},
                                    {"drift": 0.0}])
def test_bad_options_say_what_is_needed(kwargs):
    with pytest.raises(ValueError, match="autotune needs warmup >= 0, measure >= 1"):
        Search(START, **kwargs)
