"""Transparent mode: a single-process TensorFlow/Keras script trains data-parallel, unchanged.

``python -m hpcrep script.py`` runs the script inside :func:`transparent` on every rank;
``with hpcrep.tensorflow.transparent(): ...`` does the same from code. While it is active:

- every variable starts with rank 0's value (:mod:`.initial_values`);
- every Keras optimizer applies gradients averaged across ranks (:mod:`.gradients`);
- ``fit``/``evaluate``/``predict`` shard their inputs by rank (``fit`` with equal step counts),
  average training logs, sum ``evaluate``'s metric states (:mod:`.metric_states`), keep
  file-writing callbacks on rank 0, and run Keras's ``BackupAndRestore`` as hpcrep's on every
  rank (:mod:`.training`);
- XLA is off, in ``Model.compile`` and ``tf.function`` (:mod:`.xla`);
- a ``tf.data`` dataset iterated in a Python loop yields this rank's share (:mod:`.iteration`);
- a ``tf.data`` dataset that is this rank's shard already (tf.data's ``auto_shard_policy`` OFF,
  as ``hpcrep.tensorflow.hdf5_dataset`` and the Replicator's inputs set; set it on input you
  shard yourself) is never sharded again, in loops or in ``fit`` (:mod:`.sharding`);
- printing, ``model.save`` and ``save_weights`` (atomic) happen on rank 0, and ``load_weights``
  reads on rank 0 for every rank (:mod:`.rank_zero`).

Under ``python -m hpcrep``, also the files and directories the script makes itself (unless it
knows its rank): on disk a file is rank 0's, whole, while each rank reads back what it wrote, and
``if not os.path.exists(d): os.makedirs(d)`` does not fail on the rank that loses the race
(:mod:`.own_files`). From code (``with transparent():``) they are not patched: a script that
enters transparent mode itself knows it runs on N ranks; ``if on_rank_zero(): ...`` keeps a write
on rank 0.

Each of these modules has an ``install(patches)`` that patches its own attributes, and only
those (:mod:`.own_files` takes the script's path too). The patches talk to each other only
through the per-thread state of :mod:`.state` (inside ``fit``? creating variables locally?);
:mod:`.patching` records every patch so that :meth:`PatchSet.restore` undoes all of them on exit,
in reverse order.

It is a thin layer over the explicit API (``DistributedOptimizer``'s gradient reducer,
``broadcast_variables``, the Keras callbacks), not a second implementation.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Iterator, Optional

from hpcrep import comm
from hpcrep.tensorflow.transparent import own_files
from hpcrep.tensorflow.transparent.patching import PatchSet

_active: Optional[PatchSet] = None


def installers() -> tuple[ModuleType, ...]:
    """Return the modules whose ``install`` :func:`transparent` calls, in the order it calls them.

    The order, and why:

    1. :mod:`.initial_values` first: its ``install`` is the only collective one (rank 0 draws the
       random seed), so every rank reaches that broadcast before any local step that could fail
       on one rank alone and leave the others waiting in it; and its patch of variable creation
       is in place before any other ``install`` runs, should one create a variable.
    2. The rest are local and patch disjoint attributes (no patch wraps another's, which
       ``tests/mpi/test_transparent_restore.py`` checks), so their order changes nothing but the
       order of the start-up summary; they come in the order a script meets them: the
       optimizer, ``fit``, compiling, Python loops, then saving and printing.

    Restoring runs in reverse (:meth:`PatchSet.restore`): stdout comes back first, variable
    creation is unpatched last.
    """
    from hpcrep.tensorflow.transparent import (gradients, initial_values,  # noqa: PLC0415
                                               iteration, preemption, rank_zero, training, xla)

    return (initial_values, gradients, training, xla, iteration, rank_zero, preemption)


def summary(patches: PatchSet) -> str:
    """Return the one-line start-up summary: ranks, what was patched, MPI/TF/Keras versions."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    return (f"hpcrep transparent mode: {comm.size()} rank(s); patched: {'; '.join(patches.labels)}"
            f". {comm.mpi_library_version().split(',')[0]}, TensorFlow {tf.__version__}, "
            f"Keras {keras.__version__}")


@contextlib.contextmanager
def transparent(announce: bool = True, script: Optional[str] = None) -> Iterator[PatchSet]:
    """Patch TensorFlow/Keras for data-parallel training; undo every patch on exit.

    Initialises hpcrep (and TensorFlow's thread pools) if needed. Nested use is a no-op.

    Args:
        announce: print the start-up summary on rank 0 (to stderr).
        script: the script that ``python -m hpcrep`` runs, whose own files and directories
            :mod:`.own_files` looks after; None leaves them alone.

    Collective: every rank must enter (and leave) the context, in the same order.
    """
    global _active
    if _active is not None:
        yield _active
        return
    from hpcrep.tensorflow import basics  # noqa: PLC0415 - imports TensorFlow

    basics.init()
    patches = PatchSet()
    try:
        for module in installers():  # in this order: see installers()
            module.install(patches)
        if script is not None:  # last in, first restored: nothing after it opens the script's files
            own_files.install(patches, script)
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


def on_rank_zero() -> bool:
    """Return True where a script's own file writes belong: on rank 0, or in a plain
    one-process run (hpcrep not initialised, e.g. ``python script.py``).

    Under ``python -m hpcrep`` the files a script writes itself end up as rank 0's without it
    (:mod:`.own_files`); with ``with transparent():`` guard them with one line:
    ``if on_rank_zero(): image.save(path)``. Local.
    """
    return not comm.is_initialized() or comm.rank() == 0


__all__ = ["transparent", "is_active", "on_rank_zero", "installers", "summary", "PatchSet"]
