"""The FID feature classifier (bench/fid.py): trained on first use, stored atomically as HDF5,
reused afterwards, and its features separate real images from noise."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
import pytest

FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.mark.timeout(300)
def test_classifier_is_trained_once_stored_as_hdf5_and_scores_real_below_noise(skip_missing):
    if not os.path.isdir(FASHION):
        skip_missing("Debian's dataset-fashion-mnist (tools/install.sh installs it)")
    from bench import fid

    with tempfile.TemporaryDirectory(prefix="hpcrep-fid-") as cache:
        model, info = fid.feature_classifier(12, cache, train_rows=3000, epochs=1)
        path = fid.classifier_path(12, cache, train_rows=3000, epochs=1)
        assert info["path"] == path and os.listdir(cache) == [os.path.basename(path)]
        with h5py.File(path, "r") as f:  # an HDF5 file with how it was trained
            assert f.attrs["train_rows"] == 3000 and f.attrs["image_size"] == 12
        assert 0.5 < info["test_accuracy"] <= 1.0  # chance is 0.1
        stamp = os.stat(path).st_mtime_ns
        again, _ = fid.feature_classifier(12, cache, train_rows=3000, epochs=1)
        assert os.stat(path).st_mtime_ns == stamp  # loaded, not retrained

        real, _ = fid.reference_images("test", 12, 2000)
        assert real.shape == (2000, 12, 12, 1) and -1.0 <= real.min() < real.max() <= 1.0
        feats = fid.features(model, real[:10])
        assert feats.shape == (10, fid.FEATURES)
        np.testing.assert_allclose(fid.features(again, real[:10]), feats, rtol=1e-5, atol=1e-6)
        noise = np.random.default_rng(0).uniform(-1, 1, real[:1000].shape).astype(np.float32)
        same = fid.fid(model, real[:1000], real[1000:])
        assert same < 0.2 * fid.fid(model, noise, real[1000:]), same
