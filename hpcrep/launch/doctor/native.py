"""Doctor check of the compiled allreduce op: built, loadable, built for this TensorFlow and
MPI, and so which path (compiled or Python) a job's allreduces take.

The op is loaded in a child Python (:mod:`hpcrep.launch.doctor.native_probe`), exactly as a rank
would load it (:func:`hpcrep.tensorflow.native.status`), so TensorFlow never loads here.
"""

from __future__ import annotations

import json
import subprocess
import sys

from hpcrep import config
from hpcrep.launch.doctor.placement import child_env
from hpcrep.launch.doctor.result import FAIL, OK, WARN, Result

BUILD = "python -m hpcrep.tensorflow.native.build (make install does it for .venv, make ulfm " \
        "for .venv-ulfm)"


def check_native(timeout: float = 180) -> Result:
    """Report which allreduce path a job takes and, when it is not the compiled op, why and how
    to build it. FAIL when a job would fail (``HPCREP_NATIVE=on`` and the op unusable, or
    TensorFlow does not import). Local."""
    name = "compiled-op"
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "hpcrep.launch.doctor.native_probe"],
                              capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return Result(name, WARN, f"loading TensorFlow and the op took over {timeout:g} s",
                      "run python -m hpcrep.tensorflow.native to see why")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Result(name, FAIL, f"TensorFlow or hpcrep.tensorflow does not import in "
                      f"{sys.executable}: {tail}", "pip install tensorflow-cpu (make install)")
    found = json.loads(lines[-1])
    return judge(found, config.get("HPCREP_NATIVE"))


def judge(found: dict, mode: str) -> Result:
    """Return the check's result for the probe's report ``found`` under ``HPCREP_NATIVE=mode``.
    Pure."""
    name = "compiled-op"
    if found.get("error"):
        return Result(name, FAIL, f"{found['error']}", f"build it: {BUILD}, or unset "
                      "HPCREP_NATIVE")
    if found.get("active"):
        return Result(name, OK, f"jobs take the compiled path: {found['library']} loads, "
                      f"built for this TensorFlow ({found['tensorflow']}) and MPI "
                      f"({found['mpi']})")
    reason = found.get("reason", "")
    if mode == "off":
        return Result(name, OK, f"{reason} (HPCREP_NATIVE=off chosen)",
                      "unset HPCREP_NATIVE to use the compiled op")
    return Result(name, WARN, f"jobs take the slower Python path: {reason.split(': ', 1)[-1]}",
                  f"rebuild for TensorFlow {found['tensorflow']} and {found['mpi']}: {BUILD}")
