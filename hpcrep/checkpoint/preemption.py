"""Pre-timeout signals: turn Slurm's ``--signal=USR1@N`` into "checkpoint now".

A :class:`PreemptionSignal` installs a handler that only sets a flag. Ranks may see the signal at
different steps, so :meth:`PreemptionSignal.agreed` combines the flags of all ranks (one tiny
allreduce): when it returns True on one rank it returns True on all, at the same step, and the
loop saves a checkpoint and stops. Asking Slurm to run the job again is
:func:`hpcrep.slurm.requeue.requeue`'s (re-exported by :mod:`hpcrep.checkpoint`).
"""

from __future__ import annotations

import signal

import numpy as np

from hpcrep import comm


class PreemptionSignal:
    """Remember whether ``signum`` (default SIGUSR1) arrived; restore the old handler on close."""

    def __init__(self, signum: int = signal.SIGUSR1) -> None:
        self.signum = int(signum)
        self.received = False
        self._previous = signal.signal(self.signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True

    def agreed(self) -> bool:
        """Return True on every rank if any rank has received the signal.

        Collective: every rank must call this, in the same order (e.g. once per step).
        """
        if not comm.is_initialized() or comm.size() == 1:
            return self.received
        flag = comm.allreduce(np.array([float(self.received)]), comm.Max, name="preempt_flag")
        self.received = bool(flag[0])
        return self.received

    def ignore(self) -> None:
        """Ignore the signal from now on: call it after the last step, so that a signal arriving
        while a finished job shuts down (MPI finalisation) does not kill it."""
        signal.signal(self.signum, signal.SIG_IGN)

    def close(self) -> None:
        """Put back the handler that was installed before."""
        signal.signal(self.signum, self._previous)

    def __enter__(self) -> "PreemptionSignal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

