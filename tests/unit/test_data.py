"""hpcrep.data: shard arithmetic, reader slices and shuffling, convert CLI, tf.data face."""

import os

import h5py
import numpy as np
import pytest

from hpcrep.cli import main as hpcrep_main
from hpcrep.data import HDF5ShardReader, load_fashion_mnist, shard_for, write_hdf5
from hpcrep.errors import DataError


def test_shards_are_contiguous_disjoint_equal_steps():
    rows, b, n = 1003, 10, 4
    shards = [shard_for(rows, b, r, n) for r in range(n)]
    assert {s.steps for s in shards} == {25}
    assert [s.start for s in shards] == [0, 250, 500, 750] and shards[-1].stop == 1000
    with pytest.raises(DataError, match="fewer than one batch"):
        shard_for(39, 10, 0, 4)


@pytest.fixture
def h5(tmp_path):
    path = str(tmp_path / "d.h5")
    x = np.arange(130 * 3, dtype=np.float32).reshape(130, 3)
    y = np.arange(130, dtype=np.int64)
    write_hdf5(path, {"x": x, "y": y}, chunk_rows=8)
    return path


def test_reader_covers_each_shard_once_and_shuffles_per_epoch(h5):
    seen, orders = [], {}
    for r in range(3):
        reader = HDF5ShardReader(h5, ["x", "y"], 8, rank=r, size=3, seed=5)
        assert reader.steps_per_epoch == 5
        for epoch in (0, 1):
            batches = list(reader.batches(epoch))
            assert len(batches) == 5
            ys = np.concatenate([y for _, y in batches])
            np.testing.assert_array_equal(np.sort(ys), np.arange(40 * r, 40 * r + 40))
            for x, y in batches:
                np.testing.assert_array_equal(x[:, 0], y * 3)  # rows stay paired
                assert np.all(np.diff(y) == 1)  # each batch is one contiguous slice
            orders[r, epoch] = [int(y[0]) for _, y in batches]
            if epoch == 0:
                seen.append(ys)
        again = [int(y[0]) for _, y in HDF5ShardReader(h5, ["x", "y"], 8, r, 3, seed=5).batches(1)]
        assert again == orders[r, 1]  # reproducible (resume)
        resumed = [int(y[0]) for _, y in reader.batches(1, start_step=2)]
        assert resumed == orders[r, 1][2:]
    assert any(orders[r, 0] != orders[r, 1] for r in range(3))
    assert len(np.unique(np.concatenate(seen))) == 120
    plain = [int(y[0]) for (y,) in HDF5ShardReader(h5, ["y"], 8, 0, 3, shuffle=False).batches(3)]
    assert plain == [0, 8, 16, 24, 32]


def test_reader_rejects_bad_files(h5, tmp_path):
    with pytest.raises(DataError, match="no dataset"):
        HDF5ShardReader(h5, ["nope"], 8, 0, 1)
    other = str(tmp_path / "bad.h5")
    with h5py.File(other, "w") as f:
        f["a"], f["b"] = np.zeros(10), np.zeros(11)
    with pytest.raises(DataError, match="differ in rows"):
        HDF5ShardReader(other, ["a", "b"], 2, 0, 1)


def test_convert_npz_and_npy(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(50))
    np.save(tmp_path / "w.npy", np.ones((50, 2)))
    out = str(tmp_path / "o.h5")
    assert hpcrep_main(["data", "convert", str(tmp_path / "a.npz"), str(tmp_path / "w.npy"),
                        "-o", out, "--chunk-rows", "16"]) == 0
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["x"][()], x)
        assert f["x"].chunks == (16, 4) and f["w"].shape == (50, 2)
    assert hpcrep_main(["data", "convert", "-o", out]) == 2
    assert "nothing to convert" in capsys.readouterr().err


def test_convert_fashion_mnist(tmp_path, skip_missing):
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        skip_missing("Debian's dataset-fashion-mnist (tools/install.sh installs it)")
    out = str(tmp_path / "f.h5")
    assert hpcrep_main(["data", "convert", "--fashion-mnist", "-o", out]) == 0
    with h5py.File(out) as f:
        assert f["x_train"].shape == (60000, 28, 28) and f["x_train"].dtype == np.uint8
        assert f["y_test"].shape == (10000,) and set(np.unique(f["y_test"][()])) == set(range(10))
        assert f["x_train"].chunks == (256, 28, 28)
    # The first training image is a non-blank 28x28 picture with labels in range.
    data = load_fashion_mnist()
    assert data["x_train"][0].max() > 100


def test_tf_dataset(h5):
    import tensorflow as tf

    from hpcrep.tensorflow.hdf5_dataset import hdf5_dataset
    ds = hdf5_dataset(h5, ["x", "y"], 8, epochs=2, rank=1, size=3, seed=5, start_step=1)
    assert int(ds.cardinality()) == 9
    items = list(ds.as_numpy_iterator())
    assert len(items) == 9 and items[0][0].dtype == np.float32 and items[0][1].shape == (8,)
    reader = HDF5ShardReader(h5, ["x", "y"], 8, 1, 3, seed=5)
    expected = list(reader.batches(0, 1)) + list(reader.batches(1))
    for (x, y), (ex, ey) in zip(items, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
    single = next(iter(hdf5_dataset(h5, ["y"], 8, rank=0, size=1)))
    assert isinstance(single, tf.Tensor) and single.shape == (8,)


def test_tf_dataset_of_one_shard_among_several_is_marked_as_sharded(h5):
    pytest.importorskip("tensorflow")
    from hpcrep.tensorflow.hdf5_dataset import hdf5_dataset
    from hpcrep.tensorflow.presharded import is_presharded
    assert is_presharded(hdf5_dataset(h5, ["x", "y"], 8, rank=1, size=3))
    assert is_presharded(hdf5_dataset(h5, ["y"], 8, rank=0, size=2, prefetch=0))
    # the whole file (one shard of one) stays for transparent mode to share out
    assert not is_presharded(hdf5_dataset(h5, ["x", "y"], 8, rank=0, size=1))
