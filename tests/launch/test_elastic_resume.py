"""hvd.elastic's restart-from-commit without a driver: a rank fails, the whole job aborts (no
hang), and the same command with the same HPCREP_ELASTIC_DIR resumes from the last commit and
ends with the weights of a run that never failed."""

import os
from pathlib import Path

import numpy as np

JOB = str(Path(__file__).with_name("elastic_job.py"))


def test_failed_rank_then_relaunch_resumes_from_last_commit(mpirun, scratch):
    hpcrep = [mpirun.python, "-m", "hpcrep", JOB]
    elastic_dir, out = os.path.join(scratch, "state"), os.path.join(scratch, "resumed.npz")
    env = {"HPCREP_ELASTIC_DIR": elastic_dir}
    failed = mpirun.run(2, [*hpcrep, "--fail-at", "3", "--out", out], timeout=180, env=env)
    assert failed.returncode != 0
    assert "injected failure at epoch 3" in failed.stdout + failed.stderr
    assert not os.path.exists(out)
    resumed = mpirun.run(2, [*hpcrep, "--out", out], timeout=180, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 0 starts at epoch 3" in resumed.stdout  # (the runner prints rank 0 only)

    clean_out = os.path.join(scratch, "clean.npz")
    clean = mpirun.run(2, [*hpcrep, "--out", clean_out], timeout=180,
                       env={"HPCREP_ELASTIC_DIR": os.path.join(scratch, "clean-state")})
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "rank 0 starts at epoch 0" in clean.stdout
    a, b = np.load(out), np.load(clean_out)
    for key in a.files:  # weights, and (through the commit) SGD momentum, carried over
        np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)
