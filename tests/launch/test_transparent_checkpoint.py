"""HPCREP_CHECKPOINT_DIR makes an unchanged script checkpoint each epoch and resume when rerun."""

from __future__ import annotations

import csv

import h5py

from transparent_helpers import PYTHON, REPO, run_ranks, scratch_dir

N = 4
JOB = str(REPO / "jobs" / "transparent_fit_numpy.py")


def _epochs_logged(out) -> list[int]:
    with open(out / "log.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def test_rerun_resumes_from_the_last_epoch_checkpoint():
    with scratch_dir("ckpt") as root:
        ckpt, out = root / "ckpt", root / "out"
        env = {"HPCREP_CHECKPOINT_DIR": str(ckpt)}
        common = [PYTHON, "-m", "hpcrep", JOB, "--rows", "2048", "--out", str(out)]

        first = run_ranks(N, common + ["--epochs", "2"], timeout=240, env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert _epochs_logged(out) == [0, 1]
        saved = sorted(ckpt.glob("*.h5"))
        assert saved, f"no checkpoint written in {ckpt}"
        with h5py.File(saved[-1], "r") as f:  # the newest says two epochs are done
            assert int(f.attrs["epoch"]) == 2, dict(f.attrs)

        second = run_ranks(N, common + ["--epochs", "3"], timeout=240, env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "resumed from" in second.stdout + second.stderr
        assert _epochs_logged(out) == [2]  # only the third epoch ran
        assert len(list(ckpt.glob("*.h5"))) >= 2
