"""Transparent mode: a single-process TensorFlow/Keras script trains data-parallel, unchanged.

``python -m hpcrep script.py`` runs the script inside :func:`transparent` on every rank;
``with hpcrep.tensorflow.transparent(): ...`` does the same from code. While it is active:

- every variable starts with rank 0's value (:mod:`.initial_values`);
- every Keras optimizer applies gradients averaged across ranks (:mod:`.gradients`);
- ``fit``/``evaluate``/``predict`` shard their inputs by rank with equal step counts, average
  logs and metrics, keep file-writing callbacks on rank 0, and run Keras's ``BackupAndRestore``
  as hpcrep's on every rank (:mod:`.training`);
- a ``tf.data`` dataset iterated in a Python loop yields this rank's share (:mod:`.iteration`);
- printing, ``model.save`` and ``save_weights`` (atomic) happen on rank 0, ``load_weights``
  reads on rank 0 for every rank, and XLA is off (:mod:`.rank_zero`).

It is a thin layer over the explicit API (``DistributedOptimizer``'s class,
``broadcast_variables``, the Keras callbacks). Every patch is undone on exit, in reverse order.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional

from hpcrep import comm
from hpcrep.tensorflow.transparent.patching import PatchSet

_active: Optional[PatchSet] = None


def summary(patches: PatchSet) -> str:
    """Return the one-line start-up summary: ranks, what was patched, MPI/TF/Keras versions."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    return (f"hpcrep transparent mode: {comm.size()} rank(s); patched: {'; '.join(patches.labels)}"
            f". {comm.mpi_library_version().split(',')[0]}, TensorFlow {tf.__version__}, "
            f"Keras {keras.__version__}")


@contextlib.contextmanager
def transparent(announce: bool = True) -> Iterator[PatchSet]:
    """Patch TensorFlow/Keras for data-parallel training; undo every patch on exit.

    Initialises hpcrep (and TensorFlow's thread pools) if needed. Nested use is a no-op.

    Args:
        announce: print the start-up summary on rank 0 (to stderr).

    Collective: every rank must enter (and leave) the context, in the same order.
    """
    global _active
    if _active is not None:
        yield _active
        return
    from hpcrep.tensorflow import basics  # noqa: PLC0415 - imports TensorFlow
    from hpcrep.tensorflow.transparent import (gradients, initial_values,  # noqa: PLC0415
                                               iteration, rank_zero, training)

    basics.init()
    patches = PatchSet()
    try:
        for module in (initial_values, gradients, training, iteration, rank_zero):
            module.install(patches)
        _active = patches
        if announce and comm.rank() == 0:
            print(summary(patches), file=sys.stderr, flush=True)
        yield patches
    finally:
        _active = None
        patches.restore()


def is_active() -> bool:
    """Return True inside :func:`transparent`."""
    return _active is not None


__all__ = ["transparent", "is_active", "summary", "PatchSet"]
