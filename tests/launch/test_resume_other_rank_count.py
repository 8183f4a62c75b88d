"""A run checkpointed at 4 ranks continues at 2, and one at 2 continues at 4, for
``HPCREP_CHECKPOINT_DIR`` (an unchanged script checkpoints each epoch and resumes when rerun) and
for ``keras.callbacks.BackupAndRestore`` (transparent mode).

Compared for each: the state ``fit`` starts from in the resumed run (written by a callback at
``on_train_begin``, after the restore) equals bitwise the state the first run ended with (model
weights and every optimizer variable: step counter, learning rate, Adam moments); only the epochs
not yet done run; the optimizer's step counter ends at E1 x steps(n1) + (E - E1) x steps(n2)
(each rank's share of the rows is resharded for the new count); every rank ends with the same
state; the loss continues from where it was. With ``HPCREP_TRANSPARENT_SCALE_LR`` the files hold
the script's own rate and the resumed run trains at rate x (ranks now), not x (ranks then x ranks
now). Not compared, because it cannot hold: equality with an uninterrupted run at either count
(the global batch and the order of the reduction change)."""

from __future__ import annotations

import csv
import re

import h5py
import numpy as np
import pytest

E1, E, ROWS, BATCH, LR = 2, 4, 512, 16, 0.01


def steps(n: int) -> int:
    return ROWS // n // BATCH


def losses(out) -> list[float]:
    with open(out / "log.csv") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def trained_rate(stderr: str) -> float:
    """The one learning rate every rank trained at."""
    found = re.findall(r"learning-rate ([0-9.]+(?:e[+-]\d+)?)", stderr)
    rates = set(map(float, found))
    assert len(rates) == 1 and len(found) > 1, stderr[-2000:]
    return rates.pop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mechanism, n1, n2, scale", [
    # both mechanisms, both directions, learning-rate scaling on and off (each a run of its own:
    # the mechanisms restore the same state through the same transparent optimizer)
    ("backup", 4, 2, True), ("checkpoint-dir", 2, 4, False),
])
def test_resume_on_another_number_of_ranks(mechanism, n1, n2, scale, mpirun, scratch,
                                           keras_job, epochs_logged, weights_file):
    root = scratch
    env = {"HPCREP_TRANSPARENT_SCALE_LR": "1" if scale else "0"}
    protect = "backup" if mechanism == "backup" else "none"
    if mechanism == "checkpoint-dir":
        env["HPCREP_CHECKPOINT_DIR"] = str(root / "ckpt")

    first = mpirun.run(n1, keras_job.argv("transparent", protect, root / "backup",
                                          root / "first", E1, "--keep-backup"),
                       env=env, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    if mechanism == "checkpoint-dir":  # one file per epoch; the newest says E1 epochs are done
        saved = sorted((root / "ckpt").glob("*.h5"))
        assert saved, f"no checkpoint written in {root / 'ckpt'}"
        with h5py.File(saved[-1], "r") as f:
            assert int(f.attrs["epoch"]) == E1, dict(f.attrs)
    second = mpirun.run(n2, keras_job.argv("transparent", protect, root / "backup",
                                           root / "second", E, "--dump-start"),
                        env=env, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    if mechanism == "checkpoint-dir":
        assert "resumed from" in second.stdout + second.stderr

    ended = weights_file(root / "first" / "final.weights.h5")
    started = weights_file(root / "second" / "start.weights.h5")
    assert sorted(started) == sorted(ended)
    for name in ended:
        np.testing.assert_array_equal(started[name], ended[name], err_msg=name)
    assert epochs_logged(root / "second") == list(range(E1, E))
    final = weights_file(root / "second" / "final.weights.h5")
    iterations = final["optimizer/vars/0"]
    assert int(iterations) == E1 * steps(n1) + (E - E1) * steps(n2), iterations
    assert float(final["optimizer/vars/1"]) == pytest.approx(LR)  # files: the script's rate
    assert len(keras_job.digests(second.stderr)) == 1, second.stderr[-2000:]  # ranks agree
    assert second.stderr.count("weights-digest") == n2
    assert losses(root / "second")[0] < 0.5 * losses(root / "first")[0]
    assert trained_rate(first.stderr) == pytest.approx(LR * (n1 if scale else 1))
    assert trained_rate(second.stderr) == pytest.approx(LR * (n2 if scale else 1))
