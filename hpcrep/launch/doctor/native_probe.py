"""Run in a child Python by :mod:`hpcrep.launch.doctor.native`: print, as one JSON line, what
the compiled op is for this Python (its file and stamp) and which allreduce path a job takes.

Imports TensorFlow, which is why the doctor runs it in a child. Local: does not initialise MPI.
"""

from __future__ import annotations

import json
import os
import sys


def probe() -> dict:
    """Return the op's library file, its stamp (or None), the running TensorFlow and MPI, whether
    jobs take the compiled path and why (:func:`hpcrep.tensorflow.native.status`)."""
    from hpcrep.errors import ConfigError  # noqa: PLC0415
    from hpcrep.tensorflow.native import build, status  # noqa: PLC0415

    flavour, version = build.running_mpi()
    stamp_file = build.stamp_path(flavour)
    stamp = None
    if os.path.exists(stamp_file):
        with open(stamp_file) as f:
            stamp = json.load(f)
    import tensorflow as tf  # noqa: PLC0415

    out = {"library": build.library_path(flavour), "stamp": stamp, "mpi": flavour,
           "mpi_version": version, "tensorflow": tf.__version__}
    try:
        out["active"], out["reason"] = status()
        out["error"] = ""
    except ConfigError as exc:
        out["active"], out["reason"], out["error"] = False, "", str(exc)
    return out


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.stdout.flush()
