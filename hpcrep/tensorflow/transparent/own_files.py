"""The files and directories a script makes itself, under ``python -m hpcrep script.py``.

Every rank runs the script, so every rank runs its ``img.save("out.png")`` onto the same path at
once, and its ``if not os.path.exists(d): os.makedirs(d)`` fails on the rank that loses the race.
While the script runs:

- on ranks other than 0, a file the script opens for writing (a mode with ``w``, ``x``, ``a`` or
  ``+``) goes to a private copy of this rank's (a "shadow", in a per-rank temporary directory
  removed at exit), and later opens of that path on this rank, for reading too, get the shadow:
  the file on disk is rank 0's, whole, and each rank reads back what it wrote. ``a`` and ``r+``
  start from a copy of the file on disk, and ``x`` fails only if this rank made the file;
- on every rank, the script's ``os.mkdir``/``os.makedirs``/``Path.mkdir`` of a directory that
  exists already returns as if ``exist_ok=True`` had been passed (a path that exists and is not
  a directory still fails).

A file is the script's when the innermost caller of ``open``, among the script's file and
hpcrep's modules, is the script: its own code, directly or through a library (PIL, numpy,
matplotlib, pathlib, Keras called by the script), with no hpcrep frame in between. So hpcrep's
files (checkpoints, ``model.save`` on rank 0) and what Keras writes inside a patched ``fit`` are
untouched; a callback of the script's own is the script's. A directory is the script's when the
script itself calls ``mkdir``/``makedirs``/``Path.mkdir`` (``tempfile.mkdtemp`` and lock files
need ``FileExistsError``).

Covered: ``open``/``io.open`` and what calls them (``pathlib.Path``, PIL, matplotlib,
``np.save``/``np.load``, ``pickle``, ``json``, ``csv``), ``numpy.lib._datasource.open``
(``np.savetxt``/``np.loadtxt``). Not covered: ``os.open`` and file descriptors, writers in C
(TensorFlow, h5py), subprocesses, modules that kept a reference to ``open`` from before the
script ran, and whatever else the script does with the path: ``os.path.exists``, renaming,
deleting, listing or a C reader act on the disk, where on ranks other than 0 the file is rank
0's (or not there yet). Ranks are those at start: after an elastic shrink, the new rank 0 still
writes to its shadows.

A script that knows its rank (:func:`hpcrep.launch.script_api.knows_rank`) writes per-rank files
or guards its writes itself, and gets none of this. Rank 0 does not patch ``open``; on other
ranks a read costs a dict lookup once a shadow exists, and only write-mode opens walk the stack.
"""

from __future__ import annotations

import builtins
import functools
import io
import itertools
import os
import pathlib
import shutil
import sys
import tempfile
from types import FrameType
from typing import Any, Callable, Optional

import hpcrep
from hpcrep import comm
from hpcrep.tensorflow.transparent.patching import PatchSet

_OTHER, _SCRIPT, _HPCREP = 0, 1, 2
_HPCREP_DIR = os.path.dirname(os.path.abspath(hpcrep.__file__)) + os.sep
_WRITE_FLAGS = frozenset("wxa+")


class Callers:
    """Tells the script's calls from hpcrep's, by the files their code is in."""

    def __init__(self, script: str) -> None:
        self._script = (script, os.path.abspath(script))
        # Where os.makedirs and pathlib.Path.mkdir are written: they call os.mkdir.
        self._makers = frozenset({os.makedirs.__code__.co_filename,
                                  pathlib.Path.mkdir.__code__.co_filename})
        self._kinds: dict[str, int] = {}

    def _kind(self, filename: str) -> int:
        kind = self._kinds.get(filename)
        if kind is None:
            path = os.path.abspath(filename)
            kind = (_HPCREP if path.startswith(_HPCREP_DIR)
                    else _SCRIPT if filename in self._script or path == self._script[1]
                    else _OTHER)
            self._kinds[filename] = kind
        return kind

    def from_script(self, frame: Optional[FrameType]) -> bool:
        """Return True if, walking out from ``frame``, the script's code comes before hpcrep's:
        the script called, directly or through libraries."""
        while frame is not None:
            kind = self._kind(frame.f_code.co_filename)
            if kind != _OTHER:
                return kind == _SCRIPT
            frame = frame.f_back
        return False

    def directly_from_script(self, frame: Optional[FrameType]) -> bool:
        """Return True if ``frame`` is the script's, past ``os.makedirs``/``Path.mkdir``: the
        script made the directory itself (``tempfile.mkdtemp`` and lock files rely on
        ``FileExistsError``, so a library's ``mkdir`` is never the script's)."""
        while frame is not None and frame.f_code.co_filename in self._makers:
            frame = frame.f_back
        return frame is not None and self._kind(frame.f_code.co_filename) == _SCRIPT


class Shadows:
    """This rank's private copies of the paths the script wrote, by absolute path."""

    def __init__(self, rank: int, original_open: Callable) -> None:
        self._rank = rank
        self._open = original_open
        self._paths: dict[str, str] = {}
        self._directory: Optional[str] = None
        self._numbers = itertools.count()  # shadow names stay unique across threads

    def __bool__(self) -> bool:
        return bool(self._paths)

    def get(self, path: str) -> Optional[str]:
        """Return the shadow of ``path`` (absolute), or None."""
        return self._paths.get(path)

    def make(self, path: str, mode: str) -> Optional[str]:
        """Return a new shadow for ``path`` (absolute), opened next with ``mode``; None where the
        open must go to ``path`` itself, to fail as it would in one process (no such directory,
        ``r+`` of no file)."""
        if not os.path.isdir(os.path.dirname(path)):
            return None
        keeps = "w" not in mode and "x" not in mode  # a, r+: start from the file on disk
        if keeps and "a" not in mode and not os.path.isfile(path):
            return None
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix=f"hpcrep-shadow-rank{self._rank}-")
        shadow = os.path.join(self._directory, f"{next(self._numbers)}-{os.path.basename(path)}")
        if keeps and os.path.isfile(path):
            with self._open(path, "rb") as src, self._open(shadow, "wb") as dst:
                shutil.copyfileobj(src, dst)
        self._paths[path] = shadow
        return shadow

    def remove(self) -> None:
        """Delete every shadow and their directory."""
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._directory = None
        self._paths.clear()


class OwnFiles:
    """The patched ``open`` and directory calls of one rank (see the module's docstring)."""

    def __init__(self, script: str, rank: int) -> None:
        self.callers = Callers(script)
        self.shadows = Shadows(rank, builtins.open)
        self.active = True

    def _target(self, file: Any, mode: Any, frame: Optional[FrameType]) -> Any:
        """Return what to open in place of ``file``: its shadow, or ``file`` itself."""
        if not self.active or not isinstance(file, (str, bytes, os.PathLike)):
            return file
        writes = isinstance(mode, str) and not _WRITE_FLAGS.isdisjoint(mode)
        if not writes and not self.shadows:
            return file
        path = os.path.abspath(os.fsdecode(file))
        shadow = self.shadows.get(path)
        if shadow is not None or not writes or not self.callers.from_script(frame):
            return file if shadow is None else shadow
        shadow = self.shadows.make(path, mode)
        return file if shadow is None else shadow

    def opener(self, original: Callable) -> Callable:
        """Wrap an ``open(file, mode, ...)`` so that the script's writes go to shadows."""

        @functools.wraps(original)
        def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
            mode = args[0] if args else kwargs.get("mode", "r")
            return original(self._target(file, mode, sys._getframe(1)), *args, **kwargs)

        return open_

    def tolerant(self, original: Callable) -> Callable:
        """Wrap ``os.mkdir``/``os.makedirs``: an existing directory is no error for the script."""

        @functools.wraps(original)
        def make(path: Any, *args: Any, **kwargs: Any) -> None:
            try:
                original(path, *args, **kwargs)
            except FileExistsError:
                if not (self.active and kwargs.get("dir_fd") is None and os.path.isdir(path)
                        and self.callers.directly_from_script(sys._getframe(1))):
                    raise

        return make

    def close(self) -> None:
        """Stop redirecting (a module may have kept a wrapper) and delete the shadows."""
        self.active = False
        self.shadows.remove()


def install(patches: PatchSet, script: str, rank: Optional[int] = None) -> OwnFiles:
    """Patch the script's own file writes and directory calls. Local.

    Args:
        patches: records every patch, undone on exit.
        script: the file ``python -m hpcrep`` runs (its path as given, or absolute).
        rank: this rank (default: hpcrep's rank in the job).
    """
    rank = comm.rank() if rank is None else rank
    own = OwnFiles(script, rank)
    patches.on_restore(own.close)  # restored last: after open is the original again
    for name in ("mkdir", "makedirs"):
        patches.attr(os, name, own.tolerant(getattr(os, name)))
    if rank != 0:
        opener = own.opener(builtins.open)
        patches.attr(builtins, "open", opener)
        patches.attr(io, "open", opener)
        datasource = sys.modules.get("numpy.lib._datasource")
        if datasource is not None:
            patches.attr(datasource, "open", own.opener(datasource.open))
    patches.label("the script's own files (rank 0's on disk) and directories (no race)")
    return own
