"""Loaded by every Python process of a chaos trial (tests/chaos/site is first on PYTHONPATH):
with ``CHAOS_RAISE_ON_USR2=1`` SIGUSR2 makes the process raise, at the next Python instruction
of its main thread, an exception its code does not expect (the ``raise`` fault)."""

import os
import signal


class ChaosInjectedError(RuntimeError):
    """The fault a chaos trial injected."""


def _raise(signum, frame):
    raise ChaosInjectedError(f"chaos: injected failure in process {os.getpid()} (SIGUSR2)")


if os.environ.get("CHAOS_RAISE_ON_USR2") == "1":
    signal.signal(signal.SIGUSR2, _raise)
