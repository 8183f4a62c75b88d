"""One elastic commit on disk (``elastic-state-<id>.npz``): arrays and plain attributes in a
file whose loading cannot run code. numpy + json only: no pickle, no TensorFlow.

Layout: a ``.npz`` (a zip of ``.npy`` files, read with ``allow_pickle=False``) holding
``value_00000``, ``value_00001`` ... (the state's variable values, in order), ``attr_00000`` ...
(the numpy arrays and scalars among its attributes) and ``commit_json``, a uint8 array of one
UTF-8 JSON document ``{"format": FORMAT, "version": VERSION, "values": [...], "attrs": ...}``.

The document's tree keeps the attributes' Python types: JSON's null, booleans, numbers
(``NaN`` and ``Infinity`` too) and strings stand for themselves and a JSON list for a list;
every JSON object has exactly one key, which says what it holds: ``{"tuple": [...]}``,
``{"dict": [[key, value], ...]}`` (keys str or int), ``{"array": ref}`` and ``{"scalar": ref}``
(a numpy scalar, stored as a 0-d array). A ``ref`` is ``{"key": entry}``, plus ``"dtype"`` and
``"shape"`` where the ``.npy`` header cannot name the dtype (``bfloat16``): those arrays are
stored as their bytes and viewed as ``numpy.dtype(name)`` on reading (ml_dtypes, which
TensorFlow imports, registers the name).

:func:`write` replaces the file atomically; :func:`read` refuses anything it did not write.
Whether the file may be read at all (its owner and permissions) is
:func:`hpcrep.checkpoint.private_dir.check_trusted`'s question.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

from hpcrep.errors import CheckpointCorruptError, NotPlainDataError

FORMAT = "hpcrep-elastic-commit"
VERSION = 1
SUFFIX = ".npz"
_DOC = "commit_json"
_ZIP_MAGIC = b"PK\x03\x04"
_PLAIN = ("plain data only: None, bool, int, float, str, and lists, tuples and dicts (str or int "
          "keys) of them, numpy scalars and numpy arrays (not of dtype object)")


def write(path: str, values: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> None:
    """Write ``values`` (arrays) and ``attrs`` (plain data) to ``path``, atomically: a
    temporary file in the same directory, flushed and fsynced, then renamed over ``path``, so
    ``path`` is the previous complete file until the new one is. Local.

    Raises:
        NotPlainDataError: an attribute is not plain data (nothing is written).
    """
    arrays: dict[str, np.ndarray] = {}
    doc = {"format": FORMAT, "version": VERSION,
           "values": [_put_array(np.asarray(v), f"value_{i:05d}", arrays)
                      for i, v in enumerate(values)],
           "attrs": {"dict": [[name, _encode(value, name, arrays)]
                              for name, value in _attr_items(attrs)]}}
    text = json.dumps(doc, allow_nan=True).encode()
    arrays[_DOC] = np.frombuffer(text, np.uint8)
    directory, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def read(path: str) -> dict:
    """Return the commit in ``path``: ``{"attrs": dict, "values": list of arrays}``. Nothing in
    the file is unpickled or executed. Local.

    Raises:
        CheckpointCorruptError: the file is not a complete commit of this format (truncated,
            another kind of file, a ``.npz`` holding object arrays, an unknown version).
    """
    try:
        with open(path, "rb") as f:
            if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                raise _corrupt(path, "it is not a .npz (zip) file")
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                arrays = {key: z[key] for key in z.files}
    except CheckpointCorruptError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged zip makes numpy raise
        raise _corrupt(path, f"it cannot be read ({type(exc).__name__}: {exc})") from None
    try:
        return _decode_file(arrays)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise _corrupt(path, f"{type(exc).__name__}: {exc}") from None


def _attr_items(attrs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    for name in attrs:
        if type(name) is not str:
            raise NotPlainDataError(f"hpcrep: an elastic state's attribute name must be a str; "
                                    f"got {name!r} ({type(name).__name__})")
    return list(attrs.items())


def _encode(value: Any, where: str, arrays: dict[str, np.ndarray]) -> Any:
    """Return ``value``'s JSON tree, putting its arrays into ``arrays``."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value  # json writes a float's repr (exact), NaN and Infinity
    if kind is list:
        return [_encode(v, f"{where}[{i}]", arrays) for i, v in enumerate(value)]
    if kind is tuple:
        return {"tuple": [_encode(v, f"{where}[{i}]", arrays) for i, v in enumerate(value)]}
    if kind is dict:
        bad = next((k for k in value if type(k) not in (str, int)), None)
        if bad is not None:
            raise NotPlainDataError(
                f"hpcrep: the elastic state's attribute {where} is a dict with the key {bad!r} "
                f"({type(bad).__name__}), which a commit on disk cannot hold. Commit {_PLAIN}: "
                "use str keys (str(key)) or keep it out of the state.")
        return {"dict": [[k, _encode(v, f"{where}[{k!r}]", arrays)] for k, v in value.items()]}
    if isinstance(value, np.generic) and not value.dtype.hasobject:
        return {"scalar": _put_array(np.asarray(value), f"attr_{len(arrays):05d}", arrays)}
    if kind is np.ndarray and not value.dtype.hasobject:
        return {"array": _put_array(value, f"attr_{len(arrays):05d}", arrays)}
    what = (f"a numpy array of dtype {value.dtype}" if isinstance(value, np.ndarray)
            else f"a {kind.__module__}.{kind.__qualname__}")
    raise NotPlainDataError(
        f"hpcrep: the elastic state's attribute {where} is {what}, which a commit on disk "
        f"cannot hold (commits are never pickled: loading a pickle runs code). Commit {_PLAIN}: "
        "convert it (float(x), x.tolist(), np.asarray(x), dict(x)) or keep it out of the state.")


def _put_array(array: np.ndarray, key: str, arrays: dict[str, np.ndarray]) -> dict:
    """Store ``array`` under ``key``; return its reference."""
    if array.dtype.hasobject:
        raise NotPlainDataError(f"hpcrep: the elastic commit's {key} is an array of dtype "
                                f"{array.dtype}, which a commit on disk cannot hold")
    fmt = np.lib.format
    if fmt.descr_to_dtype(fmt.dtype_to_descr(array.dtype)) == array.dtype:
        arrays[key] = array
        return {"key": key}
    arrays[key] = np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)
    return {"key": key, "dtype": array.dtype.name, "shape": list(array.shape)}


def _decode_file(arrays: dict[str, np.ndarray]) -> dict:
    raw = arrays.get(_DOC)
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"it has no {_DOC} entry (not a commit written by hpcrep)")
    doc = json.loads(raw.tobytes().decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"its format is {doc.get('format') if isinstance(doc, dict) else doc!r}"
                         f", expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise ValueError(f"it is version {doc.get('version')!r} of the format; this hpcrep "
                         f"reads version {VERSION}")
    if not isinstance(doc.get("values"), list):
        raise ValueError("its values are not a list")
    attrs = _decode(doc.get("attrs"), arrays)
    if type(attrs) is not dict or not all(type(k) is str for k in attrs):
        raise ValueError("its attributes are not a dict with str keys")
    return {"attrs": attrs, "values": [_get_array(ref, arrays) for ref in doc["values"]]}


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_decode(v, arrays) for v in node]
    if type(node) is dict and len(node) == 1:
        (tag, body), = node.items()
        if tag == "tuple" and type(body) is list:
            return tuple(_decode(v, arrays) for v in body)
        if tag == "dict" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int):
                    raise ValueError(f"a dict entry {pair!r} is not a [str or int key, value]")
                out[pair[0]] = _decode(pair[1], arrays)
            return out
        if tag == "array":
            return _get_array(body, arrays)
        if tag == "scalar":
            return _get_array(body, arrays)[()]
    raise ValueError(f"an attribute node {str(node)[:80]!r} is of no known kind")


def _get_array(ref: Any, arrays: dict[str, np.ndarray]) -> np.ndarray:
    if type(ref) is not dict or type(ref.get("key")) is not str:
        raise ValueError(f"an array reference {str(ref)[:80]!r} is malformed")
    array = arrays.get(ref["key"])
    if not isinstance(array, np.ndarray) or array.dtype.hasobject:
        raise ValueError(f"the array entry {ref['key']!r} is missing")
    if "dtype" not in ref:
        return array
    shape = ref.get("shape")
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"the array entry {ref['key']!r} has a malformed shape {shape!r}")
    dtype = np.dtype(ref["dtype"])  # TypeError if nothing registered the name
    if dtype.hasobject or array.dtype != np.uint8 or \
            array.size != dtype.itemsize * math.prod(shape):
        raise ValueError(f"the array entry {ref['key']!r} does not hold {shape} {dtype}")
    return array.view(dtype).reshape(shape).copy()


def _corrupt(path: str, why: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"hpcrep: the elastic commit {path} is refused: {why}. Expected a complete "
        f"{FORMAT} version {VERSION} file as hpcrep writes it (a .npz of arrays and a JSON "
        "document; nothing in it is unpickled). Delete it to start afresh, or set "
        "HPCREP_ELASTIC_DIR to another directory.")
