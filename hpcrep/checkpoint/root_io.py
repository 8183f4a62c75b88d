"""Files that one rank writes or reads for all: atomic replacement, and an outcome every rank
agrees on.

A writer saves to :func:`temporary_beside` (same directory, same suffix, so format checks that
look at the name still pass), then :func:`commit` fsyncs it and renames it over the target: a kill
at any moment leaves the old complete file or the new complete one. :func:`agree_outcome` turns a
failure seen by the root rank into an error on every rank instead of a hang.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from hpcrep import comm
from hpcrep.errors import RemoteError

# Suffixes that savers check by name; the temporary file keeps the longest one that matches.
SUFFIXES = (".weights.h5", ".weights.json", ".keras", ".h5", ".json")


def temporary_beside(path: str) -> str:
    """Return a temporary name next to ``path`` that ends like ``path`` does. Local."""
    directory, base = os.path.split(os.path.abspath(path))
    suffix = next((s for s in SUFFIXES if base.endswith(s) and base != s), "")
    stem = base[:len(base) - len(suffix)] if suffix else base
    return os.path.join(directory, f".{stem}.tmp-{os.getpid()}{suffix}")


def fsync_path(path: str) -> None:
    """Flush ``path`` (a file or a directory) to stable storage. Local."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str, path: str) -> None:
    """Make the complete file ``tmp`` become ``path`` atomically and durably. Local.

    Fsyncs ``tmp``, renames it over ``path`` and fsyncs the directory. On failure ``tmp`` is
    removed and ``path`` is untouched.
    """
    try:
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    fsync_path(os.path.dirname(os.path.abspath(path)))


def discard(tmp: str) -> None:
    """Remove ``tmp`` if it exists (a write that did not complete). Local."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def agree_outcome(what: str, error: Optional[BaseException], root: int = 0) -> None:
    """Raise ``error`` on ``root`` and a :class:`RemoteError` on every other rank if ``root``
    failed in ``what``; return quietly everywhere if it succeeded.

    Collective: every rank must call this, in the same order (other ranks pass ``None``).
    """
    if comm.is_initialized() and comm.size() > 1:
        failed = comm.broadcast(np.array([error is not None], np.int8), root,
                                name="root_outcome")[0]
    else:
        failed = error is not None
    if error is not None:
        raise error
    if failed:
        raise RemoteError(f"rank {root} failed in {what}; see its traceback. This rank stops "
                          "too.")
