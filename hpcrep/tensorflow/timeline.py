"""Horovod's timeline API (``hvd.start_timeline`` / ``hvd.stop_timeline``) and the step marks.

The recorder is :mod:`hpcrep.comm.timeline` (Python path, every collective of
:mod:`hpcrep.comm`), the merged file :mod:`hpcrep.comm.timeline_file`; this module adds the
compiled engine's event ring as a source (:mod:`hpcrep.tensorflow.native.timeline`) and marks
training steps from TensorFlow code:

- eagerly, :func:`mark_step` calls the recorder at once;
- while a ``tf.function`` is traced, it adds a stateful host call that marks the step each time
  the function runs, but only if the timeline is on at trace time: a function traced with the
  timeline off carries nothing (no cost), and one traced before :func:`start_timeline` marks no
  steps (its collectives are still recorded; set ``HPCREP_TIMELINE`` to cover every step).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from hpcrep import config
from hpcrep.comm import timeline, timeline_file
from hpcrep.tensorflow import native

_installed: list[bool] = []


def _install_sources() -> None:
    """Make the compiled engine's ring a source of the recorder (once, where it loads)."""
    if _installed:
        return
    _installed.append(True)
    library = native.library_if_loaded()
    if library is not None:
        from hpcrep.tensorflow.native.timeline import RingSource  # noqa: PLC0415

        timeline.add_source(RingSource(library))


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline that rank 0 writes to ``file_path`` at :func:`stop_timeline`
    (or ``hvd.shutdown()``, or exit): every rank's collectives with their phases, on both
    allreduce paths, and the training steps, on rank 0's clock, as one Chrome-trace JSON.

    ``HPCREP_TIMELINE_STEPS=A:B`` limits it to steps A to B. ``mark_cycles`` also records each
    cycle of the compiled engine.

    Collective: every rank must call this, in the same order (the clocks are aligned here).
    """
    _install_sources()
    timeline_file.start(file_path, mark_cycles, config.get("HPCREP_TIMELINE_STEPS"))


def stop_timeline() -> None:
    """Stop recording; rank 0 writes the merged file.

    Collective: every rank must call this, in the same order.
    """
    timeline_file.stop()


def start_from_settings() -> None:
    """Start the timeline if ``HPCREP_TIMELINE`` names a file. Collective (``hvd.init`` calls
    it on every rank)."""
    if config.get("HPCREP_TIMELINE"):
        _install_sources()
        timeline_file.start_from_settings()


def _host_mark(source: str, edge: str) -> None:
    def mark() -> np.int64:
        (timeline.step_begin if edge == "begin" else timeline.step_end)(source)
        return np.int64(0)

    tf.numpy_function(mark, [], tf.int64, stateful=True, name=f"hpcrep_timeline_{edge}")


def mark_step(source: str, edge: str, after: Optional[Any] = None) -> None:
    """Mark the ``edge`` (``"begin"`` or ``"end"``) of a training step seen by ``source`` (one of
    :data:`hpcrep.comm.timeline.SOURCES`): now when eager, each run of the function being
    traced otherwise (after the stateful ops before it and ``after``'s tensors). Local."""
    if not timeline.started():
        return
    if tf.executing_eagerly():
        (timeline.step_begin if edge == "begin" else timeline.step_end)(source)
        return
    # variables are read (ordered after their last update in the function); tensors waited for
    deps = [tf.convert_to_tensor(t) if hasattr(t, "assign_add") else t
            for t in tf.nest.flatten(after)]
    deps = [t for t in deps if isinstance(t, (tf.Tensor, tf.Operation))]
    with tf.control_dependencies(deps):
        _host_mark(source, edge)
