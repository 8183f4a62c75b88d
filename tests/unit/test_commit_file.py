"""The elastic commit file (hpcrep/checkpoint/commit_file.py): every plain attribute comes back
with its Python type and every array to the bit; what is not plain data is refused at write; a
failed write leaves the previous commit; a damaged file, or one whose object array would run
code if unpickled, is refused without running it."""

import math
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hpcrep.checkpoint import commit_file
from hpcrep.errors import CheckpointCorruptError, NotPlainDataError


class Payload:
    """Unpickling it creates ``marker``: the proof that a load ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def same(a, b) -> bool:
    """True if ``a`` and ``b`` are equal with the same types all the way down (arrays bitwise,
    NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(type(k) is type(j) for k, j in zip(a, b)) \
            and all(same(a[k], b[k]) for k in a)
    return a == b


def every_plain_kind() -> dict:
    rng = np.random.default_rng(0)
    return {
        "none": None, "yes": True, "no": False, "zero": 0, "big": 2**70, "neg": -5,
        "f": 0.1, "negzero": -0.0, "nan": float("nan"), "inf": float("inf"),
        "ninf": float("-inf"), "s": "épique \u2603", "empty": "",
        "list": [1, [2.0, "x", None], []], "tuple": (1, (2,), (), [3]),
        "nested": {"a": 1, "b": {"c": (1.5, "d")}, "": []},
        "logs": {0: {"loss": 0.7296147942543030, "val_mae": 0.5}, 3: {}},  # the elastic fit's
        "f32": np.float32(1.25), "i64": np.int64(-7), "u8": np.uint8(255), "b": np.bool_(True),
        "f16nan": np.float16("nan"), "npstr": np.str_("abc"),
        "arr": rng.normal(size=(3, 4)).astype(np.float32), "ints": np.arange(5, dtype=">i4"),
        "zerod": np.array(3.5), "nothing": np.zeros((0, 2), np.int8),
        "bools": np.array([True, False]), "strs": np.array(["a", "bc"]),
        "in_list": [np.float64(2.5), np.ones(2)],
    }


def test_every_plain_attribute_and_array_comes_back_with_its_type_and_bits(tmp_path):
    path = str(tmp_path / "elastic-state-0.npz")
    rng = np.random.default_rng(1)
    values = [rng.normal(size=(4, 3)).astype(np.float32), np.array(7, np.int64),
              rng.normal(size=5), np.array([np.nan, -0.0, np.inf], np.float32)]
    attrs = every_plain_kind()
    commit_file.write(path, values, attrs)
    got = commit_file.read(path)
    assert set(got) == {"attrs", "values"}
    assert same(got["attrs"], attrs), (got["attrs"], attrs)
    assert same(got["values"], values)


def test_an_array_whose_dtype_npy_cannot_name_comes_back_to_the_bit(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")  # bfloat16: TensorFlow's dependency
    path = str(tmp_path / "c.npz")
    a = np.array([[1.5, -2.25], [3e38, np.nan]], ml_dtypes.bfloat16)
    commit_file.write(path, [a], {"scalar": ml_dtypes.bfloat16(0.5)})
    got = commit_file.read(path)
    assert same(got["values"][0], a) and same(got["attrs"]["scalar"], ml_dtypes.bfloat16(0.5))


@pytest.mark.parametrize("attrs, named, kind", [
    ({"history": object()}, "history", "builtins.object"),
    ({"epoch": 1, "seen": {1, 2}}, "seen", "builtins.set"),
    ({"logs": {0: {"cb": lambda: 0}}}, "logs[0]['cb']", "builtins.function"),
    ({"rows": np.array([None, 1])}, "rows", "a numpy array of dtype object"),
    ({"rows": [1, np.array([b"x", None], object)]}, "rows[1]", "dtype object"),
    ({"d": {(1, 2): 3}}, "d", "key (1, 2)"),
])
def test_an_attribute_that_is_not_plain_data_is_refused_naming_it(tmp_path, attrs, named, kind):
    path = tmp_path / "elastic-state-0.npz"
    with pytest.raises(NotPlainDataError) as info:
        commit_file.write(str(path), [np.ones(2)], attrs)
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert f"attribute {named} " in message and kind in message and "plain data" in message
    assert os.listdir(tmp_path) == []  # nothing written, no temporary left


def test_a_write_that_fails_midway_leaves_the_previous_commit(tmp_path, monkeypatch):
    path = str(tmp_path / "elastic-state-0.npz")
    commit_file.write(path, [np.arange(3.0)], {"epoch": 1})

    def half_then_fail(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        commit_file.write(path, [np.arange(3.0) * 2], {"epoch": 2})
    monkeypatch.undo()
    got = commit_file.read(path)
    assert got["attrs"] == {"epoch": 1} and same(got["values"], [np.arange(3.0)])
    assert os.listdir(tmp_path) == ["elastic-state-0.npz"]


def test_the_file_is_replaced_whole_and_only_its_owner_can_write_it(tmp_path):
    path = str(tmp_path / "c.npz")
    commit_file.write(path, [np.ones(1)], {"epoch": 1})
    commit_file.write(path, [np.zeros(1)], {"epoch": 2})
    assert commit_file.read(path)["attrs"] == {"epoch": 2}
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.listdir(tmp_path) == ["c.npz"]


@pytest.mark.parametrize("damage", ["truncated", "pickle", "garbage", "no_document",
                                    "bad_document", "too_deep"])
def test_a_damaged_or_foreign_file_is_refused_naming_it(tmp_path, damage):
    path = str(tmp_path / "elastic-state-0.npz")
    commit_file.write(path, [np.arange(100.0)], {"epoch": 1})
    file = Path(path)
    if damage == "truncated":
        file.write_bytes(file.read_bytes()[:file.stat().st_size // 2])
    elif damage == "pickle":
        file.write_bytes(pickle.dumps({"attrs": {"epoch": 1}}))
    elif damage == "garbage":
        file.write_bytes(b"\x00" * 64)
    elif damage == "no_document":
        np.savez(path, value_00000=np.ones(2))
    elif damage == "bad_document":
        np.savez(path, commit_json=np.frombuffer(b'{"format": "x"}', np.uint8))
    else:
        np.savez(path, commit_json=np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8))
    with pytest.raises(CheckpointCorruptError, match=f"elastic commit {path} is refused"):
        commit_file.read(path)


def test_an_npz_whose_object_array_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = str(tmp_path / "payload-ran")
    path = str(tmp_path / "elastic-state-0.npz")
    doc = b'{"format": "hpcrep-elastic-commit", "version": 1, "values": [{"key": ' \
          b'"value_00000"}], "attrs": {"dict": []}}'
    planted = np.empty(1, object)
    planted[0] = Payload(marker)
    np.savez(path, commit_json=np.frombuffer(doc, np.uint8), value_00000=planted)
    with pytest.raises(CheckpointCorruptError, match="Object arrays cannot be loaded"):
        commit_file.read(path)
    assert not os.path.exists(marker)
    with zipfile.ZipFile(path) as z:  # the file really carries a pickle ...
        assert "value_00000.npy" in z.namelist()
    np.load(path, allow_pickle=True)["value_00000"]  # ... that runs when unpickled
    assert os.path.exists(marker)
