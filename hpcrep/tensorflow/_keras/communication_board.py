"""Communication figures as TensorBoard scalars, beside the user's own logs.

:class:`CommunicationTensorBoard` records the timeline while ``fit`` runs and, at each epoch's end,
has rank 0 write the epoch's steps as scalars of a run ``hpcrep`` under ``log_dir`` (next to
Keras's ``train`` and ``validation`` runs): per step, the step time, compute, exposed
communication and MPI time (ms), the overlap fraction, the megabytes exchanged and the bandwidth
achieved (GB/s: bytes over MPI time), and at the epoch's last step each rank's straggler score
(ms later than the median rank). The figures are :mod:`hpcrep.analysis`'s, from the same merged
trace as ``hpcrep analyze``. Without the callback nothing is recorded (no cost); with it, what the
timeline costs. A timeline already recording (``HPCREP_TIMELINE``) is left alone and no scalars
are written (rank 0 says so once): ``hpcrep analyze`` reads that one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Optional

import tensorflow as tf

from hpcrep import comm
from hpcrep.analysis.trace import Analysis, analyze, load
from hpcrep.comm import timeline, timeline_file
from hpcrep.tensorflow._keras.callbacks import TimelineCallback
from hpcrep.tensorflow.timeline import start_timeline

RUN = "hpcrep"  # the TensorBoard run the scalars go to, a folder of log_dir


def write_scalars(result: Analysis, writer: Any, first_step: int) -> int:
    """Write ``result``'s steps as scalars numbered from ``first_step`` with ``writer`` (a
    ``tf.summary`` writer); return how many steps were written. Local (rank 0)."""
    numbers = result.step_numbers()
    with writer.as_default():
        for i, n in enumerate(numbers):
            m, step = result.mean_over_ranks(n), first_step + i
            tf.summary.scalar("hpcrep/step_ms", m["duration"], step=step)
            tf.summary.scalar("hpcrep/compute_ms", m["compute"], step=step)
            tf.summary.scalar("hpcrep/exposed_communication_ms", m["exposed"], step=step)
            tf.summary.scalar("hpcrep/mpi_ms", m["mpi"], step=step)
            tf.summary.scalar("hpcrep/megabytes", m["bytes"] / 1e6, step=step)
            if m["overlap"] is not None:
                tf.summary.scalar("hpcrep/overlap", m["overlap"], step=step)
            if m["mpi"]:
                tf.summary.scalar("hpcrep/bandwidth_gbps", m["bytes"] / m["mpi"] / 1e6,
                                  step=step)
        if numbers:
            for rank, late in sorted(result.straggler_ms.items()):
                tf.summary.scalar(f"hpcrep/straggler_ms/rank_{rank}", late,
                                  step=first_step + len(numbers) - 1)
    writer.flush()
    return len(numbers)


class CommunicationTensorBoard(TimelineCallback):
    """Write hpcrep's per-step communication figures for TensorBoard into ``log_dir/hpcrep``.

    Give it the ``log_dir`` of your ``keras.callbacks.TensorBoard`` to see both together. It
    marks each batch as a timeline step, as :class:`TimelineCallback` does (use one or the
    other). Transparent mode adds it with ``HPCREP_TENSORBOARD``. Collective: every rank must
    run it in ``fit`` (the timeline is merged at each epoch's end); rank 0 alone writes.
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None
        self._trace: Optional[str] = None
        self._written = 0
        self._recording = False

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if timeline.started():
            if comm.rank() == 0:
                print("hpcrep: a timeline is already recording (HPCREP_TIMELINE): no "
                      "communication scalars for TensorBoard; hpcrep analyze reads that "
                      "timeline", file=sys.stderr, flush=True)
            return
        if comm.rank() == 0:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, RUN))
            self._trace = os.path.join(tempfile.mkdtemp(prefix="hpcrep-board-"), "trace.json")
        self._recording = True
        start_timeline(self._trace or "unused-off-rank-0")

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._flush(restart=True)

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        self._flush(restart=False)

    def _flush(self, restart: bool) -> None:
        """Merge the timeline so far, write its steps (rank 0), and record on. Collective."""
        if not self._recording:
            return
        path = timeline_file.stop()
        if path is not None:  # rank 0
            try:
                self._written += write_scalars(analyze(load(path)), self._writer,
                                               self._written)
            finally:
                os.remove(path)
        self._recording = restart
        if restart:
            start_timeline(self._trace or "unused-off-rank-0")
        elif self._trace is not None:
            os.rmdir(os.path.dirname(self._trace))
