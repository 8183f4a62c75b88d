"""One job per checkpoint directory: an exclusive ``flock`` that rank 0 holds for the job's life.

Two jobs writing one directory would delete each other's temporary files and mix their
``<prefix>-<step>.h5`` files. :func:`hold` (called by every :class:`CheckpointManager` before it
reads or writes) makes rank 0 take ``flock(LOCK_EX | LOCK_NB)`` on ``DIR/.hpcrep-lock`` and write
its host and pid there. The lock is never released by hand: the kernel drops it when the process
ends, however it ends (exit, exception, SIGKILL), so a killed job leaves no stale lock, and the
file that stays behind is harmless. A second job is refused on every rank with
:class:`~hpcrep.errors.CheckpointLockedError` naming the holder. On network file systems
``flock`` works across hosts where the file system supports locks (NFS does, as POSIX locks).
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import Optional

from hpcrep import comm
from hpcrep.errors import CheckpointLockedError

LOCK_NAME = ".hpcrep-lock"

# Directories this process holds (rank 0): the lock's open file descriptor, kept until exit.
_held: dict[str, int] = {}


def hold(directory: str) -> None:
    """Make this job the one job on ``directory`` (nothing to take when it already is).

    Rank 0 creates the directory if needed and takes the lock; its outcome is broadcast, so
    every rank returns or every rank raises. Only rank 0's ``directory`` counts (other ranks'
    may differ: they touch no file).

    Collective: every rank must call this, in the same order.

    Raises:
        CheckpointLockedError: another process holds the directory (on every rank).
    """
    directory = os.path.abspath(directory)
    error: Optional[str] = None
    if _rank() == 0 and directory not in _held:
        fd, error = _take(directory)
        if error is None:
            _held[directory] = fd
    if comm.is_initialized() and comm.size() > 1:  # always: ranks need not agree on directory
        error = comm.broadcast_object(error, 0)
    if error is not None:
        raise CheckpointLockedError(error if _rank() == 0 else f"rank 0: {error}")


def holder(directory: str) -> str:
    """Return what the lock file of ``directory`` says of its holder ("host H, pid P"). Local."""
    try:
        with open(os.path.join(directory, LOCK_NAME)) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    return text or "a process that has not written its name yet"


def _take(directory: str) -> tuple[int, Optional[str]]:
    """Rank 0: lock ``directory``; return the descriptor, or -1 and the reason it failed."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    except OSError as exc:
        return -1, (f"cannot open the lock file {path} ({exc.strerror}); expected a checkpoint "
                    "directory rank 0 can write. Fix its permissions or choose another one")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1, (f"the checkpoint directory {directory} is in use by another job "
                    f"({holder(directory)}; lock file {path}); expected one job per directory. "
                    "Wait for that job to end or stop it, or give this job another directory "
                    "(HPCREP_CHECKPOINT_DIR)")
    except OSError as exc:
        os.close(fd)
        return -1, (f"cannot lock {path} ({exc.strerror}); expected a file system with file "
                    "locks. Put the checkpoint directory on one that has them")
    os.ftruncate(fd, 0)
    os.write(fd, f"host {socket.gethostname()}, pid {os.getpid()}\n".encode())
    return fd, None


def _rank() -> int:
    return comm.rank() if comm.is_initialized() else 0
