"""The fault campaign's pure parts (tests/chaos): a trial is a function of its seed and index
and replays from its name; the quick subset covers every recovery mode; the per-row ledger of
the ULFM job finds a row trained twice, a row lost, and the rows of a rank killed from outside
after the commit the survivors went back to; a failing trial is listed with its replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.chaos import report, schedule
from tests.chaos.jobs_ulfm import UlfmExplicitJob


def test_a_trial_is_a_function_of_seed_and_index_and_replays_from_its_name():
    trials = [schedule.draw(3, i) for i in range(40)]
    assert [t.as_dict() for t in trials] == [schedule.draw(3, i).as_dict() for i in range(40)]
    assert len({(t.mode, t.kind) for t in trials}) > 8  # the draws vary
    for t in trials:
        assert t.kind in schedule.KINDS[t.mode] and t.features in schedule.FEATURES[t.mode]
        assert schedule.parse_replay(t.name) == (3, t.index, False)
        assert len(t.faults) == (2 if t.kind == "double" else 1)
    assert schedule.parse_replay("7:2:quick") == (7, 2, True)
    with pytest.raises(ValueError, match="SEED:INDEX"):
        schedule.parse_replay("7-2")


def test_the_quick_subset_runs_every_mode_once():
    quick = [schedule.draw(schedule.QUICK_SEED, i, quick=True) for i in range(len(schedule.QUICK))]
    assert sorted(t.mode for t in quick) == sorted(schedule.MODES)
    assert all(t.replay_command().endswith(f"--replay {t.name}") for t in quick)


class TinyJob(UlfmExplicitJob):
    ROWS, EPOCHS, BATCH, SEED = 16, 1, 2, 0


def _ledger(out: Path, name: str, lines: list[dict]) -> None:
    with open(out / f"ledger-{name}.jsonl", "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


def _survivor(out: Path, name: str, resumes: list, size: int) -> None:
    (out / f"{name}.json").write_text(json.dumps({"resumes": resumes, "size": size}))


def _rows(step: int, rank: int, size: int) -> list[int]:
    order = np.random.default_rng([0, 0]).permutation(16).tolist()
    start = step * size * 2
    return order[start + rank * 2:start + (rank + 1) * 2]


def _job(tmp_path: Path) -> TinyJob:
    return TinyJob(schedule.draw(1, 0), tmp_path)


def test_the_ledger_counts_rows_kept_lost_and_trained_twice(tmp_path):
    # 2 ranks, 4 steps of 4 rows: every row once
    for r in (0, 1):
        _ledger(tmp_path, f"rank{r}", [{"t": 0, "resume": [0, 0]}] + [
            {"t": s + 1, "fed": [0, s * 4, *_rows(s, r, 2)]} for s in range(4)])
        _survivor(tmp_path, f"rank{r}", [[0, 0, 0.0]], 2)
    assert _job(tmp_path).ledger() == {"lost": 0, "duplicated": 0, "unit": "rows"}
    _ledger(tmp_path, "rank1", [{"t": s + 1, "fed": [0, s * 4, *_rows(s, 1, 2)]}
                                for s in range(4)] + [{"t": 9, "fed": [0, 0, *_rows(0, 0, 2)]}])
    assert _job(tmp_path).ledger()["duplicated"] == 2
    _ledger(tmp_path, "rank1", [{"t": s + 1, "fed": [0, s * 4, *_rows(s, 1, 2)]}
                                for s in (0, 2, 3)])  # its rows of step 1 never trained
    assert _job(tmp_path).ledger()["lost"] == 2


def test_a_dead_ranks_rows_count_up_to_the_commit_the_survivors_went_back_to(tmp_path):
    # 2 ranks for 2 steps; rank 1 dies after step 3 began; rank 0 goes back to the commit after
    # step 2 (row 8) and trains the other 8 rows alone in 4 steps of 2.
    order = np.random.default_rng([0, 0]).permutation(16).tolist()
    _ledger(tmp_path, "rank1", [{"t": s + 1, "fed": [0, s * 4, *_rows(s, 1, 2)]}
                                for s in range(3)])
    survivor = [{"t": s + 1, "fed": [0, s * 4, *_rows(s, 0, 2)]} for s in range(3)]
    survivor.append({"t": 10, "resume": [0, 8]})
    survivor += [{"t": 11 + s, "fed": [0, 8 + 2 * s, *order[8 + 2 * s:10 + 2 * s]]}
                 for s in range(4)]
    _ledger(tmp_path, "rank0", survivor)
    _survivor(tmp_path, "rank0", [[0, 0, 0.0], [0, 8, 10.0]], 1)
    assert _job(tmp_path).ledger() == {"lost": 0, "duplicated": 0, "unit": "rows"}
    # without that resume, rank 1's third step would count: its 2 rows trained twice
    _survivor(tmp_path, "rank0", [[0, 0, 0.0]], 1)
    assert _job(tmp_path).ledger()["duplicated"] == 2


def test_the_report_lists_a_failing_trial_with_its_replay(tmp_path):
    good, bad = schedule.draw(1, 0), schedule.draw(1, 1)
    records = [{"trial": good.as_dict(), "outcome": "pass", "recovery_seconds": 2.0},
               {"trial": bad.as_dict(), "outcome": "hang", "recovery_seconds": None}]
    text = report.write(tmp_path, records, 1, 10.0).read_text()
    assert f"`{bad.name}`" in text and bad.replay_command() in text
    assert good.replay_command() not in text
    assert json.loads((tmp_path / "report.json").read_text())["trials"][1]["outcome"] == "hang"


def test_a_transparent_fit_recovers_at_its_goes_on_line_not_at_its_start_up_line(tmp_path):
    from tests.chaos.jobs_ulfm import UlfmFitJob
    job = UlfmFitJob(schedule.draw(1, 0), tmp_path)
    (tmp_path / "stderr-0.txt").write_text(
        "hpcrep transparent mode: 4 rank(s); fit goes on after a failed rank (ULFM; commits at "
        "every epoch's end)\nstep end 1.0\n")
    assert not job.recovering(0, 0.0)
    with open(tmp_path / "stderr-0.txt", "a") as f:
        f.write("hpcrep: fit goes on at epoch 2 on 3 ranks (from the commit at the end of "
                "epoch 1; global batch now 3/4 of what it was)\n")
    assert job.recovering(0, 0.0)
