"""``hpcrep slurm submit`` with sbatch's own option spellings and a job name with a space (the
issue's command line): sbatch accepts the rendered script, Slurm records the name with its
space, and the job runs 4 ranks of a world of 4."""

import contextlib
import io
import os
import subprocess
import sys

import pytest

from hpcrep.cli import main as hpcrep_main


@pytest.mark.timeout(300)
def test_job_name_with_a_space_and_sbatch_spellings(slurm_env, wait_for, tmp_path):
    out = tmp_path / "spellings.out"
    code = ("import hpcrep.comm as hc; hc.init(); "
            "print(f'rank {hc.rank()} size {hc.size()}', flush=True)")
    argv = ["slurm", "submit", "--nodes", "1", "--ntasks-per-node", "4", "--time", "00:05:00",
            "--job-name", "a b", "-o", str(out), "--sbatch-option=--comment=hpcrep spellings",
            "--", sys.executable, "-c", code]
    old, printed = dict(os.environ), io.StringIO()
    os.environ.update(slurm_env)  # sbatch exports the submitting environment into the job
    try:
        with contextlib.redirect_stdout(printed):
            assert hpcrep_main(argv) == 0
    finally:
        os.environ.clear()
        os.environ.update(old)
    job = printed.getvalue().strip()
    assert job.isdigit(), printed.getvalue()
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                           text=True, env=slurm_env, timeout=30).stdout
    assert "JobName=a b " in shown, shown
    assert "Comment=hpcrep spellings" in shown, shown
    info = wait_for(job, slurm_env, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 240,
                    output=out)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text
    lines = sorted(line for line in text.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {r} size 4" for r in range(4)], text
