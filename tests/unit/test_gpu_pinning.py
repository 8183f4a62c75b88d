"""One GPU per rank, checked on CPU: what CUDA_VISIBLE_DEVICES becomes for each local rank (from a
user-set list, or from a fake driver directory standing for a node's GPUs), and what TensorFlow is
told to keep given a fake device list."""

import logging

import pytest

from hpcrep.launch import gpu
from hpcrep.tensorflow.devices import restrict_visible_gpus


@pytest.fixture(autouse=True)
def _pinning_on(monkeypatch):
    monkeypatch.delenv("HPCREP_PIN_GPU", raising=False)


def fake_driver(tmp_path, n):
    """A /proc/driver/nvidia/gpus look-alike listing ``n`` GPUs (one entry each, by bus id)."""
    for i in range(n):
        (tmp_path / f"0000:{i:02x}:00.0").mkdir()
    return str(tmp_path)


@pytest.mark.parametrize("local_rank, expected", [(0, "0"), (1, "1"), (3, "3"), (5, "1"),
                                                  (7, "3")])
def test_each_local_rank_gets_local_rank_mod_gpus(tmp_path, local_rank, expected):
    environ = {}
    assert gpu.pin(local_rank, environ, fake_driver(tmp_path, 4)) == expected
    assert environ == {"CUDA_VISIBLE_DEVICES": expected}


@pytest.mark.parametrize("user, local_rank, expected", [
    ("4,7", 0, "4"), ("4,7", 1, "7"), ("4,7", 2, "4"), (" 2 , 5 ,6", 2, "6"),
    ("GPU-aa11,GPU-bb22", 1, "GPU-bb22"), ("MIG-1c2d", 3, "MIG-1c2d")])
def test_a_user_set_list_is_respected(tmp_path, user, local_rank, expected):
    environ = {"CUDA_VISIBLE_DEVICES": user}  # the driver lists 8, the user allowed fewer
    assert gpu.pin(local_rank, environ, fake_driver(tmp_path, 8)) == expected
    assert environ["CUDA_VISIBLE_DEVICES"] == expected


def test_pinning_twice_keeps_the_same_gpu(tmp_path):
    environ = {}
    directory = fake_driver(tmp_path, 4)
    first = gpu.pin(3, environ, directory)
    assert gpu.pin(3, environ, directory) == first == environ["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize("environ", [{}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_no_gpu_changes_nothing(tmp_path, environ):
    before = dict(environ)
    assert gpu.pin(2, environ, str(tmp_path / "no-driver")) is None
    assert environ == before


def test_the_setting_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCREP_PIN_GPU", "0")
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert gpu.pin(1, environ, fake_driver(tmp_path, 4)) is None
    assert environ == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert restrict_visible_gpus(1, lambda: ["/gpu:0", "/gpu:1"], pytest.fail) is None


def test_a_negative_local_rank_is_refused():
    with pytest.raises(ValueError, match="local_rank must be >= 0"):
        gpu.choose(["0"], -1)


class FakeTF:
    """Stands for tf.config: a device list, and set_visible_devices recording what it was told."""

    def __init__(self, devices, started=False):
        self.devices, self.started, self.kept = devices, started, None

    def set_visible(self, devices, kind):
        assert kind == "GPU"
        if self.started:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.kept = list(devices)


@pytest.mark.parametrize("local_rank, n, expected", [(0, 4, 0), (2, 4, 2), (6, 4, 2), (3, 1, 0)])
def test_tensorflow_keeps_only_the_ranks_gpu(local_rank, n, expected):
    fake = FakeTF([f"PhysicalDevice(/physical_device:GPU:{i})" for i in range(n)])
    kept = restrict_visible_gpus(local_rank, lambda: fake.devices, fake.set_visible)
    assert kept == fake.devices[expected] and fake.kept == [fake.devices[expected]]


def test_too_late_warns_and_keeps_going(caplog):
    fake = FakeTF(["GPU:0", "GPU:1"], started=True)
    with caplog.at_level(logging.WARNING, logger="hpcrep"):
        assert restrict_visible_gpus(1, lambda: fake.devices, fake.set_visible) is None
    assert "still sees all 2" in caplog.text and "hvd.init()" in caplog.text


def test_cpu_only_tensorflow_lists_no_gpu():
    assert restrict_visible_gpus(0) is None  # the real tf.config on this CPU-only machine
