"""Checkpoints at any world size: rank 0 writes, every rank restores rank 0's state bitwise, and a
corrupt newest file makes every rank fall back to the same previous one."""

import os
import warnings

import numpy as np

import hpcrep.comm as hc
from hpcrep.checkpoint import CheckpointManager, PreemptionSignal


def rank_state(r, step):
    rng = np.random.default_rng(1000 * r + step)
    return {"model": [rng.normal(size=(7, 3)).astype("float32"), rng.normal(size=11)],
            "rng": {"key": rng.integers(0, 2**32, size=4, dtype=np.uint32)}}


def assert_equal_everywhere(arrays):
    assert arrays, "nothing to compare"
    gathered = hc.allgather_object([np.asarray(a) for a in arrays])
    for other in gathered[1:]:
        assert len(other) == len(gathered[0])
        for a, b in zip(gathered[0], other):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_restore_gives_rank0_state_on_every_rank(world, shared_dir):
    r, n = world
    mgr = CheckpointManager(shared_dir, keep=2)
    assert mgr.restore() is None
    path = mgr.save(rank_state(r, 5), step=5, epoch=1)  # every rank passes different state
    assert os.path.basename(path) == "ckpt-000000005.h5"
    ckpt = mgr.restore()
    assert (ckpt.step, ckpt.epoch) == (5, 1)
    expected = rank_state(0, 5)
    assert len(ckpt.list("model")) == len(expected["model"]) == 2
    for a, b in zip(ckpt.list("model"), expected["model"]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ckpt.group("rng")["key"], expected["rng"]["key"])
    assert_equal_everywhere(ckpt.list("model") + [ckpt.group("rng")["key"]])


def test_corrupt_latest_every_rank_falls_back(world, shared_dir):
    r, n = world
    mgr = CheckpointManager(shared_dir, keep=3)
    mgr.save(rank_state(r, 1), step=1)
    latest = mgr.save(rank_state(r, 2), step=2)
    if r == 0:
        os.truncate(latest, os.path.getsize(latest) // 3)
    hc.barrier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckpt = mgr.restore()
    assert ckpt.step == 1 and ckpt.skipped == [latest]
    np.testing.assert_array_equal(ckpt.list("model")[0], rank_state(0, 1)["model"][0])
    assert_equal_everywhere(ckpt.list("model"))


def test_preemption_flag_is_agreed(world):
    r, n = world
    with PreemptionSignal() as sig:
        assert sig.agreed() is False
        if r == n - 1:
            os.kill(os.getpid(), sig.signum)  # only the last rank gets the signal
        assert sig.agreed() is True  # ... and every rank learns of it at the same call
