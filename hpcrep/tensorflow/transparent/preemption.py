"""Slurm's pre-timeout signal (``--signal USR1@N``) in a script with nothing to save on it.

With ``HPCREP_CHECKPOINT_DIR``, ``fit`` checkpoints on SIGUSR1 (and requeues: see
:mod:`hpcrep.tensorflow._keras.checkpoint_callback`). Without it, SIGUSR1's default action would
end every rank (exit 138) minutes before the time limit, with nothing saved. While transparent
mode runs, a SIGUSR1 that nothing else handles is reported on stderr (rank 0, once) and the
job goes on to its time limit. A handler the script installs itself replaces this one.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from hpcrep import comm, config
from hpcrep.tensorflow.transparent.patching import PatchSet


def _note(signum: int, frame: Any) -> None:
    if comm.rank() == 0 and not _note.said:  # type: ignore[attr-defined]
        _note.said = True  # type: ignore[attr-defined]
        print("hpcrep: SIGUSR1 arrived (Slurm's pre-timeout signal, --signal USR1@N), but "
              "HPCREP_CHECKPOINT_DIR is not set: nothing is saved, and the job goes on until "
              "its time limit. Set HPCREP_CHECKPOINT_DIR (hpcrep slurm render --checkpoint-dir "
              "DIR) to checkpoint, and with --requeue to requeue, on the signal.",
              file=sys.stderr, flush=True)


_note.said = False  # type: ignore[attr-defined]


def install(patches: PatchSet) -> None:
    """Make an unhandled SIGUSR1 a warning instead of the end of every rank, where no
    checkpoint directory would use it. Local; the main thread only."""
    if (config.get("HPCREP_CHECKPOINT_DIR") or threading.current_thread()
            is not threading.main_thread()):
        return
    if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
        return  # the script's, or a launcher's, own handler
    previous = signal.signal(signal.SIGUSR1, _note)
    patches.on_restore(lambda: signal.signal(signal.SIGUSR1, previous))
    patches.label("SIGUSR1 without HPCREP_CHECKPOINT_DIR (warned, not fatal)")
