"""One job per checkpoint directory (the lock every ``CheckpointManager`` takes) and the keys
that give each ``fit`` of a script its own checkpoints, in one process.

The other job is a real process: a child that holds the directory's lock (through the same
code) until it is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from hpcrep.checkpoint import CheckpointManager, dir_lock
from hpcrep.errors import CheckpointLockedError
from hpcrep.tensorflow._keras.checkpoint_callback import CheckpointCallback
from hpcrep.tensorflow._keras.fit_key import fit_key

HOLD = ("import sys, time; from hpcrep.checkpoint import CheckpointManager; "
        "CheckpointManager(sys.argv[1]).restore(); print('held', flush=True); time.sleep(300)")


def holder(directory) -> subprocess.Popen:
    """A child process that holds ``directory`` (it has restored from it) until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_job_is_refused_naming_the_holder_and_a_killed_holder_frees_it(tmp_path):
    directory = tmp_path / "ckpt"
    other = holder(directory)
    try:
        with pytest.raises(CheckpointLockedError) as info:
            CheckpointManager(str(directory)).save({"w": np.ones(3)}, step=1)
        message = str(info.value)
        assert f"the checkpoint directory {directory} is in use by another job" in message
        assert f"host {socket.gethostname()}, pid {other.pid}" in message
        assert "HPCREP_CHECKPOINT_DIR" in message
        assert not list(directory.glob("*.h5"))  # the refused job wrote nothing
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    deadline = time.time() + 10  # the kernel drops a dead process's lock: no stale lock
    manager = CheckpointManager(str(directory))
    manager.save({"w": np.ones(3)}, step=1)
    assert time.time() < deadline
    assert manager.restore().step == 1
    assert f"pid {os.getpid()}" in dir_lock.holder(str(directory))


def test_the_lock_is_taken_once_per_process(tmp_path):
    a, b = CheckpointManager(str(tmp_path)), CheckpointManager(str(tmp_path), prefix="other")
    a.save({"w": np.zeros(2)}, step=3)
    b.save({"w": np.ones(2)}, step=4)  # the same job: not refused by its own lock
    assert a.restore().step == 3 and b.restore().step == 4


def model(widths: list, name: str) -> keras.Model:
    layers = [keras.layers.Dense(w, name=f"{name}_{i}") for i, w in enumerate(widths)]
    net = keras.Sequential([keras.Input((4,)), *layers], name=name)
    net.compile(keras.optimizers.Adam(0.01), "mse")
    return net


def test_fit_keys_tell_fits_and_models_apart_and_repeat_for_the_same_one():
    a = model([3, 1], "a")
    assert fit_key(1, a, a.optimizer) == fit_key(1, model([3, 1], "a"), a.optimizer)
    assert fit_key(1, a, a.optimizer) != fit_key(2, a, a.optimizer)  # pre-train, fine-tune
    assert fit_key(1, a, a.optimizer) != fit_key(1, model([5, 1], "a"), a.optimizer)
    assert fit_key(1, a, a.optimizer) != fit_key(1, a, keras.optimizers.SGD())
    assert fit_key(1, a, a.optimizer).startswith("fit1-")


def test_a_fit_restores_only_its_own_checkpoint_and_leaves_others_alone(tmp_path):
    first = CheckpointCallback(str(tmp_path), keep=1, signum=None, fit_ordinal=1)
    first.set_model(model([3, 1], "m"))
    assert first.restore() == 0
    first.epoch_logs = {0: {"loss": 2.0}, 1: {"loss": 1.5}}
    first.save(2)
    second = CheckpointCallback(str(tmp_path), keep=1, signum=None, fit_ordinal=2)
    second.set_model(model([6, 2], "n"))
    assert second.restore() == 0 and second.restored is None  # not fit 1's state
    for _ in range(3):
        second.save(1)
    assert len(list(tmp_path.glob(f"ckpt-{first.key}-*.h5"))) == 1  # not pruned by fit 2
    rerun = CheckpointCallback(str(tmp_path), signum=None, fit_ordinal=1)
    net = model([3, 1], "m")
    assert rerun.restore(net) == 2
    history = rerun.history(net, 2)
    assert history.history == {"loss": [2.0, 1.5]} and history.epoch == [0, 1]
    assert net.history is history
