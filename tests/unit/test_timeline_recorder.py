"""The timeline's recorder (:mod:`hpcrep.comm.timeline`) in one process: the step window keeps
only its steps' records and switches its sources with it; the most specific source of step marks
owns the step counter; nothing is kept while off."""

from __future__ import annotations

import pytest

from hpcrep import config
from hpcrep.comm import timeline


class FakeRing:
    """A source that records when it was switched on or off, and hands back one record per
    drain while on (as the compiled engine's ring would)."""

    def __init__(self) -> None:
        self.switches: list[bool] = []
        self.dropped = 0

    def enable(self, on: bool, mark_cycles: bool) -> None:
        self.switches.append(on)

    def drain(self) -> list:
        if self.switches and self.switches[-1]:
            return [("ring", "collective", "engine", 1, 2, {"id": "r"})]
        return []


@pytest.fixture(autouse=True)
def fresh():
    timeline.stop()
    yield
    timeline.stop()


def _work(n: int) -> None:
    """One collective with one phase, as hpcrep.comm's calls record them."""
    with timeline.collective("allreduce", [f"t{n}"]):
        with timeline.phase("mpi", 8):
            pass


def test_step_window_keeps_only_its_steps_and_switches_sources():
    ring = FakeRing()
    timeline.add_source(ring)
    timeline.start(window=(2, 3))
    for step in range(6):
        _work(step)
        timeline.step_end("apply")
    records, dropped = timeline.stop()
    timeline.remove_source(ring)
    steps = [r[5]["step"] for r in records if r[1] == "step"]
    assert steps == [2, 3]
    names = {r[5]["tensors"][0] for r in records if r[1] == "collective" and r[2] != "engine"}
    assert names == {"t2", "t3"}
    # on for step 2, off after step 3, at stop, when removed
    assert ring.switches[-4:] == [True, False, False, False]
    assert sum(1 for r in records if r[0] == "ring") >= 1 and dropped == 0


def test_phases_name_their_collective_and_bytes_add_up():
    timeline.start()
    _work(0)
    records, _ = timeline.stop()
    (collective,) = [r for r in records if r[1] == "collective"]
    (phase,) = [r for r in records if r[1] == "phase"]
    assert phase[5]["collective"] == collective[5]["id"] and collective[5]["bytes"] == 8
    assert collective[3] <= phase[3] <= phase[4] <= collective[4]


def test_fit_owns_the_step_counter_over_apply_marks():
    timeline.start()
    for _ in range(3):
        timeline.step_begin("fit")
        timeline.step_end("apply")  # inside the batch: an instant, not a step
        timeline.step_end("fit")
    records, _ = timeline.stop()
    assert [r[5]["step"] for r in records if r[1] == "step"] == [0, 1, 2]
    assert [r[0] for r in records if r[1] == "mark"] == ["apply ends"] * 3


def test_nothing_is_kept_when_off():
    assert not timeline.on()
    _work(0)
    timeline.step_end("apply")
    timeline.start()
    records, _ = timeline.stop()
    assert records == []


@pytest.mark.parametrize("text, window", [("", None), ("2:5", (2, 5)), ("3:", (3, None))])
def test_window_setting_parses(monkeypatch, text, window):
    monkeypatch.setenv("HPCREP_TIMELINE_STEPS", text)
    assert config.get("HPCREP_TIMELINE_STEPS") == window


@pytest.mark.parametrize("text", ["5", "5:2", "a:b", ":3"])
def test_bad_window_setting_raises(monkeypatch, text):
    monkeypatch.setenv("HPCREP_TIMELINE_STEPS", text)
    with pytest.raises(config.ConfigError):
        config.get("HPCREP_TIMELINE_STEPS")
