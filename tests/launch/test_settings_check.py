"""Bad HPCREP_* settings stop a job before MPI and TensorFlow start: ``python -m hpcrep`` at 2
ranks prints one ``hpcrep:`` line per problem on each rank, no traceback, and exits 2 before the
script's first line runs; rank 0 alone reports a checkpoint directory it cannot write; ``hpcrep
run`` refuses before launching anything, and forwards the settings to the hosts of ``-H``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "SCRIPT STARTED"
BAD = {"HPCREP_FUSION_TRESHOLD": "1MiB", "HPCREP_STALL_TIMEOUT": "-5",
       "HPCREP_MATCH_TIMEOUT": "abc"}
LINES = [
    "hpcrep: HPCREP_FUSION_TRESHOLD is not an hpcrep setting (did you mean "
    "HPCREP_FUSION_THRESHOLD?), so it would be ignored.",
    "hpcrep: HPCREP_MATCH_TIMEOUT='abc' does not parse: expected a finite number of seconds > 0; "
    "got 'abc'.",
    "hpcrep: HPCREP_STALL_TIMEOUT='-5' is out of range: expected a finite number of seconds >= 0 "
    "(0: off); got -5.0.",
]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def script(tmp_path) -> str:
    """A script whose first line prints the marker, then would import TensorFlow."""
    path = tmp_path / "train.py"
    path.write_text(f"print({MARKER!r}, flush=True)\nimport tensorflow\n")
    return str(path)


def env(**extra: str) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "HPCREP_THREADS": "1", **extra}


def test_bad_settings_stop_every_rank_before_the_script_with_one_line_each(mpirun, script):
    started = time.monotonic()
    job = mpirun.run(2, [sys.executable, "-m", "hpcrep", script], timeout=120, env=env(**BAD))
    took = time.monotonic() - started
    assert job.returncode == 2, job.stdout + job.stderr
    assert MARKER not in job.stdout, job.stdout
    assert "Traceback" not in job.stderr, job.stderr
    # every problem, on each of the 2 ranks (mpirun may interleave the ranks' lines)
    assert job.stderr.count("hpcrep: HPCREP_") == 2 * len(LINES), job.stderr
    for line in LINES:
        assert job.stderr.count(line) == 2, (line, job.stderr)
    assert took < 60, f"the job took {took:.0f} s to refuse its settings"


def test_rank_0_alone_reports_a_checkpoint_directory_it_cannot_write(mpirun, script, tmp_path):
    a_file = tmp_path / "checkpoints"
    a_file.write_text("not a directory")
    job = mpirun.run(2, [sys.executable, "-m", "hpcrep", script], timeout=120,
                     env=env(HPCREP_CHECKPOINT_DIR=str(a_file)))
    assert job.returncode == 2, job.stdout + job.stderr
    assert MARKER not in job.stdout and "Traceback" not in job.stderr, job.stderr
    lines = [line for line in job.stderr.splitlines() if line.startswith("hpcrep: ")]
    assert lines == [f"hpcrep: HPCREP_CHECKPOINT_DIR={str(a_file)!r} cannot be used: it exists "
                     "and is not a directory; rank 0 saves checkpoints there. Point it at a "
                     "directory this process can write (it is created if missing), or unset it "
                     "to train without checkpoints."], job.stderr


def hpcrep_run(*argv: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrep.cli", "run", *argv], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env(**extra)}, cwd=ROOT)


def test_hpcrep_run_refuses_bad_settings_before_launching(script):
    done = hpcrep_run("-np", "2", script, **BAD)
    assert done.returncode == 2, done.stdout + done.stderr
    assert MARKER not in done.stdout and "Traceback" not in done.stderr, done.stderr
    assert [line[:len(want)] for line, want in zip(done.stderr.splitlines(), LINES)] == LINES


def test_hpcrep_run_forwards_every_setting_to_the_hosts_in_its_dry_run(script):
    done = hpcrep_run("--dry-run", "-np", "2", "-H", "host1,host2", "--timeline-filename",
                      "t.json", script, HPCREP_STALL_TIMEOUT="20",
                      HPCREP_FUSION_THRESHOLD="1MiB", HPCREP_TIMELINE="ignored.json")
    assert done.returncode == 0, done.stdout + done.stderr
    argv = done.stdout.split()
    for name in ("HPCREP_STALL_TIMEOUT", "HPCREP_FUSION_THRESHOLD", "HPCREP_THREADS"):
        assert argv[argv.index(name) - 1] == "-x", done.stdout
    assert "HPCREP_TIMELINE=t.json" in argv and "HPCREP_TIMELINE" not in argv, done.stdout
    assert argv[argv.index("--host") + 1] == "host1:1,host2:1", done.stdout
