"""TensorFlow's start-up noise is quiet in what hpcrep launches, and HPCREP_TF_LOG=all brings it
back: the stderr of a real 2-rank ``hpcrep run`` of a tf.function allreduce, both ways."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TF_LINE = re.compile(r"^[IWEF]\d{4} ", re.M)  # absl's prefix: severity, month, day


def run(setting: str) -> subprocess.CompletedProcess:
    """Run tf_log_job.py on 2 ranks with ``hpcrep run`` and HPCREP_TF_LOG=setting, leaving
    TF_CPP_MIN_LOG_LEVEL unset (tests/conftest.py set it for this process)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(HPCREP_TF_LOG=setting, HPCREP_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "hpcrep.cli", "run", "-n", "2",
                           str(HERE / "tf_log_job.py")], capture_output=True, text=True,
                          timeout=280, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "sum 24 of 2 ranks" in done.stdout, done.stdout
    return done


def _message(line: str) -> str:
    """A log line without absl's time stamp and thread id: what was said, and where."""
    return line.split("] ", 1)[-1] if TF_LINE.match(line) else line


def unavoidable() -> set[str]:
    """What TensorFlow prints on this machine when it loads even at TF_CPP_MIN_LOG_LEVEL=3: on
    CPUs where oneDNN's custom operations are on (Intel Xeon with AVX-512, this machine kind)
    TensorFlow 2.21 logs that notice, and absl's preamble, before absl is initialised, so no
    log level hides them (only TF_ENABLE_ONEDNN_OPTS=0, which changes numerics, does)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True,
                          text=True, timeout=120, env=env)
    return {_message(line) for line in done.stderr.splitlines() if line.strip()}


@pytest.mark.timeout(600)
def test_quiet_by_default_and_all_brings_tensorflow_lines_back():
    quiet = run("quiet")
    noise = [line for line in quiet.stderr.splitlines()
             if TF_LINE.match(line) or "absl::InitializeLog" in line or "layout failed" in line]
    baseline = unavoidable()
    assert not [line for line in noise if _message(line) not in baseline], quiet.stderr

    loud = run("all")
    assert TF_LINE.search(loud.stderr), loud.stderr
    # Grappler optimises graphs that hold the compiled allreduce: no pass gives up on them. (Its
    # static shape pass used to skip everything after an op whose name holds "Enqueue", taking
    # it for a queue's, so the layout optimizer and the remapper, whose fused conv/matmul +
    # bias + activation kernels matter on CPUs, failed on every such graph.)
    assert "native True" in loud.stdout or os.environ.get("HPCREP_NATIVE") == "off", loud.stdout
    assert not re.search(r"meta_optimizer\.cc.*failed", loud.stderr), loud.stderr
