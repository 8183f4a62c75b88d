"""The benchmark's Horovod peer: a job run under .venv-peers/bin/python times hpcrep and Horovod
side by side (SN-GAN: its embedding gradient is a tf.IndexedSlices among dense tensors).

Horovod is optional (``make peers``); without .venv-peers this test skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.peers import horovod_status
from bench.placement import thread_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sngan_job_times_hpcrep_and_horovod_under_the_peers_python(tmp_path):
    status = horovod_status(ROOT)
    if status["status"] != "importable":
        pytest.skip(f"Horovod is optional and {status['status']} here: make peers builds it")
    from hpcrep.launch.mpirun import mpirun_command, mpirun_env

    out = tmp_path / "sngan.json"
    command = mpirun_command(2, [status["python"], "-m", "jobs.sngan",
                                 "--modes", "nosync,hpcrep,horovod", "--bench-json", str(out),
                                 "--image-size", "16", "--g-ch", "16", "--d-ch", "16",
                                 "--batch", "8", "--n-dis", "1", "--rounds", "2", "--steps", "2"])
    env = dict(mpirun_env(), TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, **thread_env(1))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540,
                          cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"nosync", "hpcrep", "horovod"}
    for mode, r in runs.items():
        assert r["throughput"] > 0 and r["comm_ms"] is not None, (mode, r)
        assert r["threads_per_rank"] == 1, (mode, r)
    assert sys.executable != status["python"]
