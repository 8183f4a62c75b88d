"""HPCREP_TENSORBOARD=auto under ``python -m hpcrep``: an unchanged script's Keras TensorBoard
callback gets hpcrep's communication scalars beside its own runs (log_dir/hpcrep), one per step
of every epoch, read back with TensorBoard's own reader; off by default (nothing written)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

JOB = str(Path(__file__).with_name("tensorboard_job.py"))


def _tags_and_steps(run_dir: Path) -> dict[str, list[int]]:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(run_dir),
                                             size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("setting", ["auto", ""], ids=["auto", "off"])
def test_keras_tensorboard_gets_hpcrep_scalars_beside_its_runs(mpirun, scratch, setting):
    logs = scratch / "logs"
    done = mpirun.run(2, [mpirun.python, "-m", "hpcrep", JOB, str(logs)],
                      env={"HPCREP_THREADS": "1", "HPCREP_TENSORBOARD": setting})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (logs / "train").is_dir()  # Keras's own run (rank 0 only)
    if not setting:
        assert not (logs / "hpcrep").exists()
        return
    found = _tags_and_steps(logs / "hpcrep")
    steps = list(range(2 * 64 // (8 * 2)))  # 2 epochs of 4 steps: 64 rows, 8 a rank a step
    for tag in ("hpcrep/step_ms", "hpcrep/exposed_communication_ms", "hpcrep/megabytes",
                "hpcrep/bandwidth_gbps", "hpcrep/overlap"):
        assert found.get(tag) == steps, (tag, found)
    assert sorted(t for t in found if "straggler" in t) == [
        "hpcrep/straggler_ms/rank_0", "hpcrep/straggler_ms/rank_1"]
    assert not [p for p in os.listdir(scratch) if p.startswith("hpcrep-board")]
