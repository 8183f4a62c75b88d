"""Slurm's pre-timeout signal reaching an unchanged script that has no HPCREP_CHECKPOINT_DIR:
SIGUSR1 used to end every rank (exit 138) with nothing saved; now rank 0 says once what would
make use of it and the job trains on to its end."""

from __future__ import annotations

from pathlib import Path

import pytest

JOB = str(Path(__file__).with_name("usr1_job.py"))


@pytest.mark.timeout(300)
def test_sigusr1_without_a_checkpoint_dir_is_a_warning_not_the_end(mpirun):
    done = mpirun.run(2, [mpirun.python, "-m", "hpcrep", JOB],
                      env={"HPCREP_THREADS": "1", "HPCREP_CHECKPOINT_DIR": ""})
    output = done.stdout[-2000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "trained 3 epochs" in done.stdout, output
    assert done.stderr.count("SIGUSR1 arrived (Slurm's pre-timeout signal") == 1, output
    assert "Set HPCREP_CHECKPOINT_DIR" in done.stderr
