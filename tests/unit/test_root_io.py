"""Files one rank writes for all: temporary names keep the suffix savers check, a commit replaces
the target whole, and a failed write leaves the old file."""

import os

import pytest

from hpcrep.checkpoint.root_io import agree_outcome, commit, discard, temporary_beside


@pytest.mark.parametrize("name, ending", [
    ("latest.weights.h5", ".weights.h5"), ("best.keras", ".keras"), ("ckpt-1.h5", ".h5"),
    ("training_metadata.json", ".json"), ("plain", "")])
def test_temporary_name_is_beside_and_keeps_the_suffix(tmp_path, name, ending):
    tmp = temporary_beside(str(tmp_path / name))
    assert os.path.dirname(tmp) == str(tmp_path)
    assert os.path.basename(tmp).startswith(".") and tmp.endswith(ending)
    assert f".tmp-{os.getpid()}" in tmp and tmp != str(tmp_path / name)


def test_commit_replaces_the_target_whole(tmp_path):
    target = tmp_path / "a.weights.h5"
    target.write_bytes(b"old")
    tmp = temporary_beside(str(target))
    with open(tmp, "wb") as f:
        f.write(b"new contents")
    commit(tmp, str(target))
    assert target.read_bytes() == b"new contents" and not os.path.exists(tmp)


def test_a_failed_commit_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "sub"
    target.mkdir()  # a directory cannot be replaced by a file
    (target / "keep").write_text("x")
    tmp = temporary_beside(str(target))
    open(tmp, "w").close()
    with pytest.raises(OSError):
        commit(tmp, str(target))
    assert (target / "keep").read_text() == "x" and not os.path.exists(tmp)
    discard(tmp)  # already gone: no error


def test_agree_outcome_in_one_process():
    agree_outcome("nothing", None)
    with pytest.raises(KeyError):
        agree_outcome("a save", KeyError("x"))
