"""One GPU per rank for TensorFlow: pin ``CUDA_VISIBLE_DEVICES`` (:mod:`hpcrep.launch.gpu`), and
restrict TensorFlow's visible GPUs to the rank's own in case CUDA had started already.

:func:`pin_gpu` runs in :func:`hpcrep.tensorflow.init` (``hvd.init()``), so also at the start of
transparent mode (``python -m hpcrep``, ``hpcrep run``), before a script creates its first tensor.
If TensorFlow initialised its devices earlier, neither can change what it uses: a warning says
so and names the fix (initialise hpcrep first).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from hpcrep import comm, config
from hpcrep.launch import gpu

log = logging.getLogger("hpcrep")


def restrict_visible_gpus(local_rank: int,
                          list_gpus: Callable[[], Sequence[Any]] = lambda:
                          tf.config.list_physical_devices("GPU"),
                          set_visible: Callable[[Sequence[Any], str], None] =
                          tf.config.set_visible_devices) -> Optional[Any]:
    """Make TensorFlow see only GPU ``local_rank % n`` of the ``n`` GPUs it lists.

    Returns the device kept, or None when TensorFlow lists no GPU or pinning is off. When
    ``CUDA_VISIBLE_DEVICES`` was pinned in time TensorFlow lists one GPU and this keeps it.
    Local.
    """
    if not config.get("HPCREP_PIN_GPU"):
        return None
    devices = list(list_gpus())
    if not devices:
        return None
    mine = devices[local_rank % len(devices)]
    try:
        set_visible([mine], "GPU")
    except RuntimeError as exc:  # the runtime already started: too late to choose
        log.warning("hpcrep: TensorFlow initialised its GPUs before hpcrep did, so local rank "
                    "%d still sees all %d of them (%s). Call hvd.init() before creating any "
                    "tensor, or set HPCREP_PIN_GPU=0 to silence this.", local_rank,
                    len(devices), exc)
        return None
    return mine


def pin_gpu() -> Optional[str]:
    """Pin this rank to GPU ``local_rank % visible GPUs`` (environment, then TensorFlow).

    Returns the ``CUDA_VISIBLE_DEVICES`` entry chosen, or None. Requires
    :func:`hpcrep.comm.init`. Local.
    """
    local_rank = comm.local_rank()
    chosen = gpu.pin(local_rank)
    restrict_visible_gpus(local_rank)
    return chosen
