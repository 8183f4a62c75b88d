"""One checkpoint file: flat ``name -> array`` datasets in HDF5, a checksum, atomic writes.

Layout: every array is a dataset whose path is its name (``model/00003``, ``rng/numpy_key``);
the root group carries the attributes ``format``, ``sha256`` and the caller's integer/float/str
metadata (``step``, ``epoch`` ...). Nothing is pickled: only numeric arrays are accepted.

The checksum is SHA-256 over, for each dataset in sorted name order, its name, dtype, shape and
bytes. A truncated file fails to open or to read; a file whose bytes changed fails the checksum;
both raise :class:`hpcrep.errors.CheckpointCorruptError`.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

import h5py
import numpy as np

from hpcrep.checkpoint.root_io import fsync_path
from hpcrep.errors import CheckpointCorruptError, CheckpointError

FORMAT = "hpcrep-checkpoint-1"
_RESERVED = ("format", "sha256")


def checksum(arrays: Mapping[str, np.ndarray]) -> str:
    """Return the hex SHA-256 of ``arrays`` (names, dtypes, shapes and bytes, in name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.hexdigest()


def _check_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in arrays.items():
        a = np.asarray(value)
        if a.dtype.kind not in "biuf" and a.dtype != np.bool_:
            raise CheckpointError(
                f"checkpoint entry {name!r} has dtype {a.dtype}; expected a numeric or bool array "
                "(hpcrep checkpoints hold no pickled objects). Convert it to an array first.")
        if not name or name.startswith("/") or name.endswith("/"):
            raise CheckpointError(f"checkpoint entry name {name!r} must be a non-empty relative "
                                  "path such as 'model/00001'")
        out[name] = a
    return out


def write_atomic(path: str, arrays: Mapping[str, Any], attrs: Mapping[str, Any]) -> str:
    """Write ``arrays`` and ``attrs`` to ``path`` so that ``path`` is either the old file or the
    complete new one, never a partial file.

    Writes a temporary file in the same directory, flushes and fsyncs it, renames it over
    ``path`` and fsyncs the directory. Local: call it on one rank only. Returns the checksum.

    Raises:
        CheckpointError: an entry is not a numeric array, or an attribute name is reserved.
    """
    arrays = _check_arrays(arrays)
    bad = [k for k in attrs if k in _RESERVED]
    if bad:
        raise CheckpointError(f"attribute names {bad} are reserved by the checkpoint format")
    digest = checksum(arrays)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            for name in sorted(arrays):
                f.create_dataset(name, data=arrays[name])
            for key, value in attrs.items():
                f.attrs[key] = value
            f.attrs["format"] = FORMAT
            f.attrs["sha256"] = digest  # written last: a file without it is incomplete
            f.flush()
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return digest


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable (fsync the directory itself)."""
    fsync_path(directory)


def read_verified(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read every dataset and attribute of checkpoint ``path`` and verify its checksum.

    Local. Returns ``(arrays, attrs)``; ``attrs`` excludes the reserved ``format``/``sha256``.

    Raises:
        CheckpointCorruptError: the file is truncated, unreadable, of another format, or its
            contents do not match the stored checksum.
    """
    arrays: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:
            fmt = _text(f.attrs.get("format"))
            stored = _text(f.attrs.get("sha256"))
            if fmt != FORMAT or not stored:
                raise CheckpointCorruptError(
                    f"{path}: not a complete hpcrep checkpoint (format={fmt!r}, "
                    f"checksum={'present' if stored else 'missing'}); expected format {FORMAT!r}")
            attrs = {k: _plain(v) for k, v in f.attrs.items() if k not in _RESERVED}

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    arrays[name] = obj[()]

            f.visititems(visit)
    except CheckpointCorruptError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise CheckpointCorruptError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); "
                                     "the file is truncated or damaged") from None
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    actual = checksum(arrays)
    if actual != stored:
        raise CheckpointCorruptError(f"{path}: checksum mismatch (stored {stored[:16]}..., "
                                     f"computed {actual[:16]}...); the file is damaged")
    return arrays, attrs


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value
