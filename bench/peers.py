"""Where the benchmark's peers run: Horovod lives in its own venv, ``.venv-peers/``.

Horovod 0.28.1 has no wheel for TF 2.21 and needs source edits to build (``make peers``,
``tools/peers.sh``); it gets a venv of its own, with the same TensorFlow, Keras, mpi4py and numpy
as ``.venv`` and hpcrep installed editable, so that a benchmark job can run under that venv's
Python and time Horovod (``DistributedGradientTape``, or ``grouped_allreduce`` in an optimizer)
in an MPI job of its own, against that job's own unsynchronised step.
"""

from __future__ import annotations

import os
import subprocess
from typing import Optional

PEERS_VENV = ".venv-peers"
HOW_TO_BUILD = ("make peers (builds Horovod 0.28.1 from its sdist into .venv-peers/, about "
                "5 minutes on 2 cores; bench/README.md, section Horovod)")


def peers_python(root: str) -> Optional[str]:
    """Return the peers venv's Python under ``root``, or None if the venv does not exist."""
    path = os.path.join(root, PEERS_VENV, "bin", "python")
    return path if os.access(path, os.X_OK) else None


def horovod_status(root: str) -> dict:
    """Whether ``horovod.tensorflow`` imports in the peers venv under ``root``.

    Returns a dict with ``status``: ``"importable"`` (with ``python``, ``version``, ``path``),
    ``"not built"`` (no peers venv) or ``"not importable"`` (with the ``error``); the last two
    carry ``how_to_build``.
    """
    python = peers_python(root)
    if python is None:
        return {"status": "not built", "how_to_build": HOW_TO_BUILD}
    code = "import horovod, horovod.tensorflow as h; print(horovod.__version__); print(h.__file__)"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if proc.returncode == 0:
        version, path = (proc.stdout.strip().splitlines() + ["?", "?"])[:2]
        return {"status": "importable", "python": python, "version": version, "path": path,
                "note": "timed as the 'horovod' variant (horovod.tensorflow."
                        "DistributedGradientTape, or grouped_allreduce op=Average in SN-GAN's "
                        "optimizers) in a job of its own with its own nosync"}
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"status": "not importable", "python": python, "error": last,
            "how_to_build": HOW_TO_BUILD}
