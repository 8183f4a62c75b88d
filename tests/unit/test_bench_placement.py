"""Cores per rank: the default, oversubscription, and that a job really runs with (and records)
the threads the harness gives it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.placement import default_cores_per_rank, oversubscribed, thread_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_default_cores_per_rank_fits_the_largest_rank_count():
    assert default_cores_per_rank(2, [1, 2]) == 1
    assert default_cores_per_rank(16, [1, 2, 4, 8]) == 2
    assert default_cores_per_rank(2, [1, 2, 4]) == 1          # at least 1: 4 ranks oversubscribe
    assert oversubscribed(2, 1, 4) and not oversubscribed(2, 1, 2)
    with pytest.raises(ValueError):
        default_cores_per_rank(2, [0, 2])


def test_thread_env_sets_hpcrep_threads_and_refuses_zero():
    assert thread_env(3) == {"HPCREP_THREADS": "3", "OMP_NUM_THREADS": "3",
                             "HPCREP_INTER_OP_THREADS": "2"}
    # One core per rank: one inter-op thread too, whatever the machine has spare.
    assert thread_env(1)["HPCREP_INTER_OP_THREADS"] == "1"
    with pytest.raises(ValueError, match="at least 1"):
        thread_env(0)


@pytest.mark.slow
def test_a_job_given_n_cores_per_rank_runs_and_records_n_threads():
    code = ("import hpcrep.tensorflow as hvd; from bench.timing import time_rounds; hvd.init(); "
            "print(time_rounds({'a': lambda: 0.0}, 2, 1, 1.0)['a']['threads_per_rank'])")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, **thread_env(3))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "3"     # not cores // ranks (at most 2 here)
