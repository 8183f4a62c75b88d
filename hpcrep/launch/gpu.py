"""One GPU per rank: rank i sees only GPU ``local_rank % visible GPUs`` (through
``CUDA_VISIBLE_DEVICES``, before CUDA starts).

The GPUs to share out are those the process may already see: the entries of a
``CUDA_VISIBLE_DEVICES`` that is set (by the user, or by Slurm for the job's ``--gres``; indices,
``GPU-<uuid>`` or ``MIG-<uuid>``, kept as written), else the NVIDIA GPUs the driver lists in
``/proc/driver/nvidia/gpus``. Pinning is idempotent: once a rank sees one GPU, pinning again
keeps it. ``HPCREP_PIN_GPU=0`` turns it off. This module knows nothing of TensorFlow
(:mod:`hpcrep.tensorflow.devices` restricts TensorFlow's own device list as a second line).
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional, Sequence

from hpcrep import config

VARIABLE = "CUDA_VISIBLE_DEVICES"
DRIVER_GPUS = "/proc/driver/nvidia/gpus"


def driver_gpus(directory: str = DRIVER_GPUS) -> list[str]:
    """Return ``["0", "1", ...]``, one per GPU the NVIDIA driver lists (none without a driver)."""
    try:
        return [str(i) for i in range(len(os.listdir(directory)))]
    except OSError:
        return []


def visible_gpus(environ: Optional[MutableMapping[str, str]] = None,
                 directory: str = DRIVER_GPUS) -> list[str]:
    """Return the GPUs this process may use: ``CUDA_VISIBLE_DEVICES``'s entries when it is set
    (an empty value means none), else the driver's GPUs."""
    environ = os.environ if environ is None else environ
    if VARIABLE in environ:
        return [d.strip() for d in environ[VARIABLE].split(",") if d.strip()]
    return driver_gpus(directory)


def choose(devices: Sequence[str], local_rank: int) -> Optional[str]:
    """Return the GPU of local rank ``local_rank``: ``devices[local_rank % len(devices)]``."""
    if local_rank < 0:
        raise ValueError(f"local_rank must be >= 0; got {local_rank}")
    return devices[local_rank % len(devices)] if devices else None


def pin(local_rank: int, environ: Optional[MutableMapping[str, str]] = None,
        directory: str = DRIVER_GPUS) -> Optional[str]:
    """Set ``CUDA_VISIBLE_DEVICES`` in ``environ`` (default ``os.environ``) to this rank's GPU.

    Returns the GPU chosen, or None when pinning is off (``HPCREP_PIN_GPU=0``) or there is no
    GPU (then nothing is changed). Must run before CUDA starts in this process to take effect.
    Local.
    """
    environ = os.environ if environ is None else environ
    if not config.get("HPCREP_PIN_GPU"):
        return None
    chosen = choose(visible_gpus(environ, directory), local_rank)
    if chosen is not None:
        environ[VARIABLE] = chosen
    return chosen
