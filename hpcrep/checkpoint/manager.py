"""Keep the last K checkpoints of a run in one directory; save on rank 0, restore on all ranks.

``CheckpointManager(directory, keep=3)`` names files ``ckpt-<step>.h5``. :meth:`save` writes on
rank 0 (atomically, see :mod:`hpcrep.checkpoint.h5file`) and deletes all but the newest ``keep``.
:meth:`restore` has rank 0 try the newest file first and fall back, with a warning, to older
ones when a file is truncated or fails its checksum; rank 0 then broadcasts what it read, and
every rank verifies the checksum of what it received, so all ranks end up bitwise identical.
The directory need only be visible to rank 0. One job per directory: the first save or restore
takes the directory's lock (:mod:`hpcrep.checkpoint.dir_lock`), held until the job ends; a second
job on it gets :class:`~hpcrep.errors.CheckpointLockedError` on every rank.

State is a nested mapping whose leaves are numeric arrays; a list or tuple of arrays is stored
as ``name/00000``, ``name/00001``... (read back with :meth:`Checkpoint.list`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import warnings
from typing import Any, Mapping, Optional

import numpy as np

from hpcrep import comm
from hpcrep.checkpoint import dir_lock, h5file
from hpcrep.errors import CheckpointCorruptError, CheckpointError

log = logging.getLogger("hpcrep.checkpoint")


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint was unusable and an older one was restored instead."""


@dataclasses.dataclass
class Checkpoint:
    """A restored checkpoint: flat arrays plus the step, epoch and other metadata saved with it."""

    path: str
    step: int
    epoch: int
    arrays: dict[str, np.ndarray]
    attrs: dict[str, Any]
    skipped: list[str] = dataclasses.field(default_factory=list)

    def list(self, name: str) -> list[np.ndarray]:
        """Return the arrays saved from a list under ``name``, in their original order."""
        pattern = re.compile(re.escape(name) + r"/(\d+)$")
        found = sorted((int(m.group(1)), k) for k in self.arrays if (m := pattern.match(k)))
        return [self.arrays[k] for _, k in found]

    def group(self, name: str) -> dict[str, np.ndarray]:
        """Return the arrays saved from a mapping under ``name``, keyed by their names in it."""
        prefix = name + "/"
        return {k[len(prefix):]: v for k, v in self.arrays.items() if k.startswith(prefix)}


def flatten(state: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Flatten a nested mapping of arrays (lists allowed) into ``{"a/b/00001": array}``."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        if "/" in str(key):
            raise CheckpointError(f"state key {key!r} contains '/'; use nested mappings instead")
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "/"))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                out[f"{path}/{i:05d}"] = np.asarray(item)
        else:
            out[path] = np.asarray(value)
    return out


class CheckpointManager:
    """Save and restore a training run's state in ``directory``, keeping the newest ``keep``.

    Args:
        directory: where checkpoints go; created by rank 0 if missing.
        keep: how many checkpoints to keep (at least 1). Keeping 2 or more lets :meth:`restore`
            fall back when the newest file is damaged.
        prefix: file name prefix (``<prefix>-<step>.h5``).
    """

    def __init__(self, directory: str, keep: int = 3, prefix: str = "ckpt") -> None:
        if not isinstance(keep, int) or keep < 1:
            raise CheckpointError(f"keep must be an integer >= 1; got {keep!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            raise CheckpointError(f"prefix {prefix!r} must be letters, digits, '_', '.' or '-'")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.prefix = prefix
        self._pattern = re.compile(re.escape(prefix) + r"-(\d+)\.h5$")

    # ----- local queries -------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, str]]:
        """Return ``(step, path)`` of the checkpoint files present, oldest first. Local."""
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            m = self._pattern.match(name)
            if m:
                found.append((int(m.group(1)), os.path.join(self.directory, name)))
        return sorted(found)

    def path_for(self, step: int) -> str:
        """Return the file name used for ``step``."""
        return os.path.join(self.directory, f"{self.prefix}-{step:09d}.h5")

    # ----- collective operations -----------------------------------------------------------
    def save(self, state: Mapping[str, Any], step: int, epoch: int = 0,
             **metadata: Any) -> str:
        """Write ``state`` as the checkpoint of ``step`` and prune old checkpoints.

        Only rank 0's ``state`` is written (others may pass the same or an empty mapping). Extra
        keyword metadata (ints, floats, strings) is stored as attributes and returned by
        :meth:`restore` in ``Checkpoint.attrs``.

        Collective: every rank must call this, in the same order. A failure on rank 0 raises
        :class:`CheckpointError` on every rank; another job holding the directory,
        :class:`~hpcrep.errors.CheckpointLockedError`.

        Returns:
            The path of the new checkpoint.
        """
        if int(step) < 0:
            raise CheckpointError(f"step must be >= 0; got {step}")
        path = self.path_for(int(step))
        dir_lock.hold(self.directory)
        error = ""
        if _rank() == 0:
            try:
                os.makedirs(self.directory, exist_ok=True)
                self._remove_stale_temporaries()
                h5file.write_atomic(path, flatten(state),
                                    {"step": int(step), "epoch": int(epoch), **metadata})
                self._prune()
            except Exception as exc:  # noqa: BLE001 - agreed below, re-raised on every rank
                error = f"{type(exc).__name__}: {exc}"
        error = _from_root(error)
        if error:
            raise CheckpointError(f"saving checkpoint {path} failed on rank 0: {error}")
        return path

    def restore(self) -> Optional[Checkpoint]:
        """Return the newest readable checkpoint on every rank, or None if there is none.

        Rank 0 tries files newest first; a truncated or corrupt file is skipped with a
        :class:`CheckpointFallbackWarning`. Rank 0 broadcasts the arrays it read and every
        rank checks their checksum.

        Collective: every rank must call this, in the same order.

        Raises:
            CheckpointCorruptError: checkpoint files exist but none of them is readable.
            CheckpointLockedError: another job holds the directory.
        """
        dir_lock.hold(self.directory)
        header: Any = None
        arrays: dict[str, np.ndarray] = {}
        if _rank() == 0:
            header, arrays = self._read_newest_good()
        header = _from_root(header)
        if header is None:
            return None
        if "error" in header:
            raise CheckpointCorruptError(header["error"])
        if _size() > 1:
            names = [n for n, _, _ in header["layout"]]
            local = [arrays[n] if _rank() == 0 else np.empty(shape, dtype)
                     for n, shape, dtype in header["layout"]]
            received = comm.grouped_broadcast(local, 0, name="checkpoint_restore")
            arrays = {n: np.array(a, copy=True) for n, a in zip(names, received)}
            bad = float(h5file.checksum(arrays) != header["sha256"])
            if comm.allreduce(np.array([bad]), comm.Max, name="checkpoint_verify")[0]:
                raise CheckpointError(f"restoring {header['path']}: the state received on some "
                                      "rank differs from rank 0's (checksum mismatch)")
        for skipped in header["skipped"]:
            if _rank() != 0:
                log.info("checkpoint %s was unusable; rank 0 fell back", skipped)
        attrs = dict(header["attrs"])
        return Checkpoint(path=header["path"], step=int(attrs.pop("step", 0)),
                          epoch=int(attrs.pop("epoch", 0)), arrays=arrays, attrs=attrs,
                          skipped=list(header["skipped"]))

    # ----- rank 0 internals ----------------------------------------------------------------
    def _read_newest_good(self) -> tuple[Optional[dict], dict[str, np.ndarray]]:
        candidates = self.checkpoints()
        if not candidates:
            return None, {}
        skipped: list[str] = []
        for _, path in reversed(candidates):
            try:
                arrays, attrs = h5file.read_verified(path)
            except CheckpointCorruptError as exc:
                skipped.append(path)
                warnings.warn(f"{exc}; falling back to the previous checkpoint",
                              CheckpointFallbackWarning, stacklevel=3)
                log.warning("%s; falling back to the previous checkpoint", exc)
                continue
            layout = [(n, arrays[n].shape, arrays[n].dtype.str) for n in sorted(arrays)]
            return {"path": path, "attrs": attrs, "layout": layout, "skipped": skipped,
                    "sha256": h5file.checksum(arrays)}, arrays
        return {"error": f"none of the {len(candidates)} checkpoints in {self.directory} is "
                         f"readable ({', '.join(os.path.basename(p) for p in skipped)}); remove "
                         "them to start afresh"}, {}

    def _prune(self) -> None:
        for _, path in self.checkpoints()[:-self.keep]:
            os.unlink(path)

    def _remove_stale_temporaries(self) -> None:
        mine = f".tmp-{os.getpid()}"
        for name in os.listdir(self.directory):
            if name.startswith(f".{self.prefix}-") and ".tmp-" in name and not name.endswith(mine):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass


def _rank() -> int:
    return comm.rank() if comm.is_initialized() else 0


def _size() -> int:
    return comm.size() if comm.is_initialized() else 1


def _from_root(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (small metadata only). Collective when MPI is running."""
    return comm.broadcast_object(value, 0) if _size() > 1 else value
