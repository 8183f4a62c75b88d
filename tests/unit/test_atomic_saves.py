"""Transparent mode's rank-0 saves write a temporary file and rename it into place: a save that
dies half-way leaves the previous file intact and no temporary behind; real Keras saves land
under the name asked for; and a learning rate scaled by the number of ranks is saved unscaled."""

import os

import h5py
import keras
import numpy as np
import pytest

from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow._keras.checkpoint_callback import training_state
from hpcrep.tensorflow.transparent.rank_zero import _write_atomically


class Model:
    """Stands for a keras.Model whose save dies after writing part of the file."""

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        with open(filepath, "wb") as f:
            f.write(b"half a fi")
        raise OSError("disk full")


def test_a_save_that_dies_leaves_the_old_file(tmp_path):
    target = tmp_path / "ckpt-003.weights.h5"
    target.write_bytes(b"the complete previous file")
    with pytest.raises(OSError, match="disk full"):
        _write_atomically(Model.save_weights, Model(), (str(target),), {})
    assert target.read_bytes() == b"the complete previous file"
    assert os.listdir(tmp_path) == [target.name]


def small_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("name", ["w.weights.h5", "m.keras"])
def test_real_keras_saves_land_under_the_name_asked_for(tmp_path, name):
    model = small_model()
    saver = keras.Model.save_weights if name.endswith(".weights.h5") else keras.Model.save
    _write_atomically(saver, model, (str(tmp_path / name),), {})
    assert os.listdir(tmp_path) == [name]
    restored = small_model()
    restored.load_weights(str(tmp_path / name))
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_refused_overwrite_goes_to_keras_unchanged(tmp_path):
    calls = []
    target = tmp_path / "x.weights.h5"
    target.write_bytes(b"keep")
    _write_atomically(lambda self, filepath, overwrite=True: calls.append(filepath), None,
                      (str(target),), {"overwrite": False})
    assert calls == [str(target)]


def test_scaled_learning_rate_is_saved_unscaled(tmp_path):
    model = small_model()
    lr_scale.scale_learning_rate(model.optimizer, 4)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.04)
    with lr_scale.unscaled(model.optimizer):
        model.save_weights(str(tmp_path / "w.weights.h5"))
    assert float(model.optimizer.learning_rate) == pytest.approx(0.04)
    with h5py.File(tmp_path / "w.weights.h5") as f:
        assert float(f["optimizer/vars/1"][()]) == pytest.approx(0.01)
    model.load_weights(str(tmp_path / "w.weights.h5"))  # the file's (unscaled) rate ...
    lr_scale.rescale_after_load(model.optimizer)         # ... scaled again for this run
    assert float(model.optimizer.learning_rate) == pytest.approx(0.04)


def test_a_loss_scale_optimizers_scaled_inner_rate_is_saved_unscaled(tmp_path):
    """Transparent mode scales the rate of the optimizer that reaches Keras's ``apply``: for a
    ``LossScaleOptimizer`` (mixed precision), its inner one. Saving the wrapper must still write
    the unscaled rate, and loading must scale it again."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)), "mse")
    lso = model.optimizer
    lso.build(model.trainable_variables)
    lr_scale.scale_learning_rate(lso.inner_optimizer, 4)
    assert float(lso.learning_rate) == pytest.approx(0.04)
    state = training_state(model, lso)  # hpcrep checkpoints (HPCREP_CHECKPOINT_DIR) ...
    with lr_scale.unscaled(lso):        # ... and rank 0's Keras saves
        model.save_weights(str(tmp_path / "w.weights.h5"))
    assert float(lso.learning_rate) == pytest.approx(0.04)
    rates = [a for v, a in zip(lso.variables, state["optimizer"]) if v.name == "learning_rate"]
    assert [float(a) for a in rates] == pytest.approx([0.0, 0.01])  # the wrapper's, the inner's
    with h5py.File(tmp_path / "w.weights.h5") as f:
        assert float(f["optimizer/inner_optimizer/vars/1"][()]) == pytest.approx(0.01)
    model.load_weights(str(tmp_path / "w.weights.h5"))
    lr_scale.rescale_after_load(lso)
    assert float(lso.learning_rate) == pytest.approx(0.04)


def test_a_name_keras_refuses_is_refused_with_the_users_name(tmp_path):
    with pytest.raises(ValueError, match="my-model-dir"):
        _write_atomically(keras.Model.save, small_model(), (str(tmp_path / "my-model-dir"),), {})
    assert os.listdir(tmp_path) == []
