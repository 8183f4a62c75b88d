"""What an elastic state's ``committed()`` (the resume's reader, rank 0) refuses before reading a
byte of the commit in ``HPCREP_ELASTIC_DIR``: a directory or file others can write or another user
owns, a leftover commit in the old pickle format, a planted ``.npz`` carrying a pickle. Planted
files carry a payload that would create a marker file if it ran; it never does."""

import os
import pickle

import numpy as np
import pytest

from hpcrep.checkpoint import commit_file
from hpcrep.errors import (CheckpointCorruptError, CheckpointFormatError, HpcrepError,
                           UntrustedFileError)
from hpcrep.tensorflow.elastic.state import ObjectState


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


@pytest.fixture
def elastic_dir(tmp_path, monkeypatch):
    """A private HPCREP_ELASTIC_DIR, and a state whose commit file would be read there."""
    directory = tmp_path / "commits"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", str(directory))
    state = ObjectState(epoch=0)
    return directory, state, directory / f"elastic-state-{state._state_id}.npz"


def good_commit(path) -> None:
    commit_file.write(str(path), [], {"epoch": 3, "logs": {0: {"loss": 0.5}}})


def test_a_private_commit_is_read(elastic_dir):
    directory, state, path = elastic_dir
    assert state.committed() is None  # nothing there yet
    good_commit(path)
    assert state.committed() == {"attrs": {"epoch": 3, "logs": {0: {"loss": 0.5}}},
                                 "values": []}


@pytest.mark.parametrize("dir_mode, file_mode, problem", [
    (0o770, 0o600, "is writable by group (mode 0770)"),
    (0o707, 0o600, "is writable by others (mode 0707)"),
    (0o777, 0o600, "is writable by group and others (mode 0777)"),
    (0o700, 0o620, "it is writable by group (mode 0620)"),
    (0o700, 0o646, "it is writable by others (mode 0646)"),
])
def test_a_commit_others_can_write_is_refused(elastic_dir, dir_mode, file_mode, problem):
    directory, state, path = elastic_dir
    good_commit(path)
    os.chmod(path, file_mode)
    os.chmod(directory, dir_mode)
    with pytest.raises(UntrustedFileError) as info:
        state.committed()
    message = str(info.value)
    assert str(path) in message and problem in message
    assert "chmod go-w" in message and "HPCREP_ELASTIC_DIR to a private directory" in message
    assert state._read_from_disk is None


def test_a_sticky_directory_is_trusted_for_a_file_of_ours(elastic_dir):
    directory, state, path = elastic_dir
    good_commit(path)
    os.chmod(directory, 0o1777)  # as /tmp: others may add files, not replace ours
    assert state.committed()["attrs"]["epoch"] == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
@pytest.mark.parametrize("whose", ["file", "directory", "file_in_sticky"])
def test_a_commit_or_directory_of_another_user_is_refused(elastic_dir, whose):
    directory, state, path = elastic_dir
    good_commit(path)
    os.chown(directory if whose == "directory" else path, 4242, -1)
    if whose == "file_in_sticky":
        os.chmod(directory, 0o1777)
    with pytest.raises(UntrustedFileError, match="belongs to uid 4242, not to you"):
        state.committed()


def test_a_leftover_pickle_commit_is_refused_unread(elastic_dir, tmp_path):
    directory, state, path = elastic_dir
    marker = tmp_path / "payload-ran"
    old = directory / f"elastic-state-{state._state_id}.pkl"
    old.write_bytes(pickle.dumps(Payload(str(marker))))
    with pytest.raises(CheckpointFormatError) as info:
        state.committed()
    message = str(info.value)
    assert f"{old} is an elastic commit in the old pickle format" in message
    assert "loading a pickle runs" in message and f"Delete {old}" in message
    assert not marker.exists()
    good_commit(path)  # a new commit beside it does not make the old file welcome
    with pytest.raises(CheckpointFormatError):
        state.committed()
    assert not marker.exists()
    pickle.loads(old.read_bytes())  # the planted file does run code when unpickled
    assert marker.exists()


def test_a_planted_npz_with_a_pickled_object_array_is_refused_unrun(elastic_dir, tmp_path):
    directory, state, path = elastic_dir
    marker = tmp_path / "payload-ran"
    planted = np.empty(1, object)
    planted[0] = Payload(str(marker))
    with open(path, "wb") as f:
        np.savez(f, commit_json=np.frombuffer(b"{}", np.uint8), value_00000=planted)
    with pytest.raises(CheckpointCorruptError, match=f"elastic commit {path} is refused"):
        state.committed()
    assert not marker.exists()


def test_every_refusal_is_an_hpcrep_error():
    for kind in (CheckpointCorruptError, CheckpointFormatError, UntrustedFileError):
        assert issubclass(kind, HpcrepError)
