"""hvd.elastic's restart-from-commit without a driver: a rank fails, the whole job aborts (no
hang), and the same command with the same HPCREP_ELASTIC_DIR resumes from the last commit and
ends with the weights of a run that never failed."""

import os

import numpy as np

from transparent_helpers import PYTHON, REPO, run_ranks, scratch_dir

JOB = str(REPO / "tests" / "launch" / "elastic_job.py")


def test_failed_rank_then_relaunch_resumes_from_last_commit():
    with scratch_dir("elastic") as tmp:
        elastic_dir, out = os.path.join(tmp, "state"), os.path.join(tmp, "resumed.npz")
        env = {"HPCREP_ELASTIC_DIR": elastic_dir}
        failed = run_ranks(2, [PYTHON, "-m", "hpcrep", JOB, "--fail-at", "3", "--out", out],
                           timeout=180, env=env)
        assert failed.returncode != 0
        assert "injected failure at epoch 3" in failed.stdout + failed.stderr
        assert not os.path.exists(out)
        resumed = run_ranks(2, [PYTHON, "-m", "hpcrep", JOB, "--out", out], timeout=180, env=env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "rank 0 starts at epoch 3" in resumed.stdout  # (the runner prints rank 0 only)

        clean_out = os.path.join(tmp, "clean.npz")
        clean = run_ranks(2, [PYTHON, "-m", "hpcrep", JOB, "--out", clean_out], timeout=180,
                          env={"HPCREP_ELASTIC_DIR": os.path.join(tmp, "clean-state")})
        assert clean.returncode == 0, clean.stderr[-3000:]
        assert "rank 0 starts at epoch 0" in clean.stdout
        a, b = np.load(out), np.load(clean_out)
        for key in a.files:  # weights, and (through the commit) SGD momentum, carried over
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)
