"""HPCREP_CHECKPOINT_DIR makes an unchanged script checkpoint each epoch and resume when rerun."""

from __future__ import annotations

import h5py

N = 4


def test_rerun_resumes_from_the_last_epoch_checkpoint(mpirun, scratch, epochs_logged):
    ckpt, out = scratch / "ckpt", scratch / "out"
    env = {"HPCREP_CHECKPOINT_DIR": str(ckpt)}
    common = [mpirun.python, "-m", "hpcrep", str(mpirun.root / "jobs" / "transparent_fit_numpy.py"),
              "--rows", "2048", "--out", str(out)]

    first = mpirun.run(N, common + ["--epochs", "2"], timeout=240, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert epochs_logged(out) == [0, 1]
    saved = sorted(ckpt.glob("*.h5"))
    assert saved, f"no checkpoint written in {ckpt}"
    with h5py.File(saved[-1], "r") as f:  # the newest says two epochs are done
        assert int(f.attrs["epoch"]) == 2, dict(f.attrs)

    second = mpirun.run(N, common + ["--epochs", "3"], timeout=240, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from" in second.stdout + second.stderr
    assert epochs_logged(out) == [2]  # only the third epoch ran
    assert len(list(ckpt.glob("*.h5"))) >= 2
