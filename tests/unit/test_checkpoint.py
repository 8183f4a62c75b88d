"""hpcrep.checkpoint in one process: round trip, pruning, atomic writes under a real crash,
corrupt and truncated files detected and skipped, RNG state round trip."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hpcrep.checkpoint import (CheckpointFallbackWarning, CheckpointManager, flatten,
                               host_rng_state, read_verified, set_host_rng_state, write_atomic)
from hpcrep.errors import CheckpointCorruptError, CheckpointError


def state(seed):
    rng = np.random.default_rng(seed)
    return {"model": [rng.normal(size=(5, 3)).astype("float32"), rng.normal(size=3)],
            "optimizer": [np.array(seed, np.int64), rng.normal(size=(5, 3)).astype("float32")],
            "rng": {"key": np.arange(4, dtype=np.uint32) + seed},
            "input": {"position": np.array(seed * 10, np.int64)}}


def assert_state_equal(ckpt, expected):
    assert len(ckpt.list("model")) == len(expected["model"]) == 2
    assert len(ckpt.list("optimizer")) == len(expected["optimizer"]) == 2
    for a, b in zip(ckpt.list("model"), expected["model"]):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    for a, b in zip(ckpt.list("optimizer"), expected["optimizer"]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ckpt.group("rng")["key"], expected["rng"]["key"])
    assert int(ckpt.group("input")["position"]) == int(expected["input"]["position"])


def test_round_trip_and_keep_last_k(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=2)
    assert mgr.restore() is None
    for step in (1, 2, 3):
        mgr.save(state(step), step=step, epoch=step // 2, note="hello")
    assert [s for s, _ in mgr.checkpoints()] == [2, 3]
    ckpt = mgr.restore()
    assert (ckpt.step, ckpt.epoch, ckpt.attrs["note"]) == (3, 1, "hello")
    assert len(ckpt.list("model")) == 2
    assert_state_equal(ckpt, state(3))


def corrupt_middle(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        # Damage the last data bytes (array payload sits at the end of small HDF5 files).
        f.seek(size - 64)
        data = bytearray(f.read(32))
        f.seek(size - 64)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_latest_falls_back_to_previous(tmp_path, damage):
    mgr = CheckpointManager(str(tmp_path), keep=3)
    mgr.save(state(1), step=10)
    latest = mgr.save(state(2), step=20)
    if damage == "flip":
        corrupt_middle(latest)
    elif damage == "truncate":
        os.truncate(latest, os.path.getsize(latest) // 2)
    else:
        os.truncate(latest, 0)
    with pytest.raises(CheckpointCorruptError):
        read_verified(latest)
    with pytest.warns(CheckpointFallbackWarning, match="ckpt-000000020"):
        ckpt = mgr.restore()
    assert ckpt.step == 10 and ckpt.skipped == [latest]
    assert_state_equal(ckpt, state(1))


def test_a_changed_value_in_a_readable_file_fails_the_checksum(tmp_path):
    """Damage HDF5 itself reads without complaint (one value of one dataset rewritten, the file
    well formed): only the checksum over the arrays' bytes can tell, and it must."""
    import h5py

    mgr = CheckpointManager(str(tmp_path), keep=3)
    mgr.save(state(1), step=10)
    latest = mgr.save(state(2), step=20)
    with h5py.File(latest, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and o.size > 1
                     else None)
        data = f[names[0]][()]
        data.flat[0] = data.flat[0] + 1
        f[names[0]][...] = data
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
        read_verified(latest)
    with pytest.warns(CheckpointFallbackWarning, match="ckpt-000000020"):
        ckpt = mgr.restore()
    assert ckpt.step == 10
    assert_state_equal(ckpt, state(1))


def test_all_corrupt_raises(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    path = mgr.save(state(1), step=1)
    os.truncate(path, 100)
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CheckpointCorruptError,
                                                               match="none of the 1"):
        mgr.restore()


def test_crash_mid_write_leaves_last_good(tmp_path):
    """SIGKILL a process while it writes a large checkpoint: the previous one still restores."""
    mgr = CheckpointManager(str(tmp_path), keep=3)
    # What an earlier job left (written without taking the directory: the writer is another job)
    write_atomic(mgr.path_for(1), flatten(state(1)), {"step": 1, "epoch": 0})
    script = textwrap.dedent(f"""
        import numpy as np
        from hpcrep.checkpoint import CheckpointManager
        big = {{"model": [np.full((256, 1024), i, np.float32) for i in range(400)]}}
        CheckpointManager({str(tmp_path)!r}).save(big, step=2)
        print("finished", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if any(".tmp-" in n for n in os.listdir(tmp_path)):
            time.sleep(0.2)  # let it write part of the file
            break
        time.sleep(0.01)
    assert proc.poll() is None, "writer finished before it could be killed; make it bigger"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert [s for s, _ in mgr.checkpoints()] == [1]  # the partial file never got the real name
    ckpt = mgr.restore()
    assert ckpt.step == 1
    assert_state_equal(ckpt, state(1))
    mgr.save(state(3), step=3)  # the next save removes the dead writer's temporary
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_rejects_objects_and_bad_arguments(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    with pytest.raises(CheckpointError, match="no pickled objects"):
        mgr.save({"x": np.array([object()])}, step=1)
    with pytest.raises(CheckpointError, match="keep"):
        CheckpointManager(str(tmp_path), keep=0)
    with pytest.raises(CheckpointError, match="step"):
        mgr.save({}, step=-1)


def test_host_rng_state_round_trip():
    random.seed(3)
    np.random.seed(4)
    random.gauss(0, 1)
    np.random.normal()
    saved = host_rng_state()
    expected = (random.random(), random.gauss(0, 1), np.random.normal(size=3))
    random.seed(99)
    np.random.seed(99)
    set_host_rng_state({k: np.array(v) for k, v in saved.items()})
    got = (random.random(), random.gauss(0, 1), np.random.normal(size=3))
    assert got[0] == expected[0] and got[1] == expected[1]
    np.testing.assert_array_equal(got[2], expected[2])
