"""hvd.elastic without a driver: commit/restore/sync of object, TensorFlow and Keras states
(Horovod test_tensorflow.py::test_elastic_state) and @hvd.elastic.run."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import NotPlainDataError, RemoteError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def test_tensorflow_state_sync_restore_commit(world):
    """Horovod test_elastic_state, step by step."""
    r, _ = world
    v = 1.0 if r == 0 else 2.0
    variables = [tf.Variable(np.full([2, 2], v)), tf.Variable(np.full([2], v))]
    other = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.zeros(2)]
    state = hvd.elastic.TensorFlowState(variables, batch=20 + r, epoch=10 + r)
    state.sync()
    for var in variables:  # after sync, every rank holds the root's values
        np.testing.assert_array_equal(var.numpy(), np.ones(var.shape))
    assert (state.batch, state.epoch) == (20, 10)
    for var, value in zip(variables, other):  # modify, then restore: back to the synced state
        var.assign(value)
    state.batch, state.epoch = 21, 11
    state.restore()
    for var in variables:
        np.testing.assert_array_equal(var.numpy(), np.ones(var.shape))
    assert (state.batch, state.epoch) == (20, 10)
    for var, value in zip(variables, other):  # modify, commit, restore: the committed state
        var.assign(value)
    state.batch, state.epoch = 21, 11
    state.commit()
    state.restore()
    for var, value in zip(variables, other):
        np.testing.assert_array_equal(var.numpy(), value)
    assert (state.batch, state.epoch) == (21, 11)


def test_keras_state_and_run(world):
    r, n = world
    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    state = hvd.elastic.TensorFlowKerasState(model, epoch=r, history=[r])
    calls = []

    @hvd.elastic.run
    def train(state, epochs):
        calls.append((state.epoch, list(state.history)))
        for epoch in range(state.epoch, epochs):
            model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), verbose=0)
            state.epoch = epoch + 1
            state.history.append(epoch)
            state.commit()
        return model.get_weights()

    weights = train(state, 2)
    assert calls == [(0, [0])]  # synced from rank 0 before the first call
    gathered = hvd.allgather_object([w.tolist() for w in weights])
    assert all(g == gathered[0] for g in gathered)
    committed = [w.copy() for w in model.get_weights()]
    slots = [np.asarray(v).copy() for v in model.optimizer.variables]
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), verbose=0)
    state.epoch = 99
    state.restore()  # weights and Adam's slots return to the last commit
    for w, c in zip(model.get_weights(), committed):
        np.testing.assert_array_equal(w, c)
    for v, s in zip(model.optimizer.variables, slots):
        np.testing.assert_array_equal(np.asarray(v), s)
    assert state.epoch == 2 and state.history == [0, 0, 1]


def test_object_state_and_reset_callbacks(world):
    r, n = world
    state = hvd.elastic.ObjectState(rows=[r] * 3, name=f"rank{r}")
    state.rows.append(9)  # in-place change, not committed
    state.restore()
    assert state.rows == [r] * 3
    state.sync()
    assert state.rows == [0, 0, 0] and state.name == "rank0"
    seen = []
    state.register_reset_callbacks([lambda: seen.append("reset")])
    state.on_reset()
    assert seen == ["reset"]


def test_keras_elastic_pattern_of_horovods_example(world):
    """Horovod examples/tensorflow2/tensorflow2_keras_mnist_elastic.py's structure: KerasState,
    reset callbacks, Update{Epoch,Batch}StateCallback, CommitStateCallback, @hvd.elastic.run."""
    import hpcrep.tensorflow.keras as hvdk

    r, n = world
    keras.utils.set_random_seed(r)
    model = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01 * n)),
                  loss="mse")
    state = hvdk.elastic.KerasState(model, batch=0, epoch=0)
    state.register_reset_callbacks([lambda: None])
    callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvdk.callbacks.MetricAverageCallback(),
                 hvdk.elastic.UpdateEpochStateCallback(state),
                 hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.CommitStateCallback(state, batches_per_commit=2)]
    x = np.random.default_rng(r).normal(size=(16, 3)).astype("float32")

    @hvdk.elastic.run
    def train(state):
        state.model.fit(x, x[:, :1], batch_size=4, callbacks=callbacks,
                        epochs=3 - state.epoch, verbose=0)

    train(state)
    assert (state.epoch, state.batch) == (3, 0)
    final = [w.copy() for w in model.get_weights()]
    model.set_weights([w + 1 for w in final])
    state.restore()  # the last commit was at the last batch (4 batches, every 2)
    for w, f in zip(model.get_weights(), final):
        np.testing.assert_array_equal(w, f)
    gathered = hvd.allgather_object([w.tolist() for w in final])
    assert all(g == gathered[0] for g in gathered)


def test_a_commit_on_disk_from_another_model_is_refused_with_what_differs(world, monkeypatch,
                                                                          tmp_path):
    """With ``HPCREP_ELASTIC_DIR``, a state resuming from a commit that another model wrote
    (here a Dense(3) where it was a Dense(2)) raises on rank 0, which reads the file, naming the
    file, the variable and both shapes, instead of assigning what fits and going on."""
    r, _ = world
    directory = hvd.broadcast_object(str(tmp_path), 0)  # rank 0's directory on every rank
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", directory)
    before = hvd.elastic.TensorFlowKerasState(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), epoch=1)
    before.commit()  # rank 0 writes elastic-state-<id>.npz; no rank returns before it is there
    after = hvd.elastic.TensorFlowKerasState(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)]), epoch=0)
    after._state_id = before._state_id  # the same state of a changed script, run again
    if r == 0:
        with pytest.raises(ValueError, match=r"elastic commit .*elastic-state-\d+\.npz does not "
                           r"fit this model: it holds 2 variables, the state has 2; variable 0 "
                           r"is \(3, 2\) there and \(3, 3\) here"):
            after._resume_from_disk()
        assert after.epoch == 0
    hvd.barrier()


def test_a_keras_state_commit_on_disk_comes_back_to_the_bit_with_its_types(world, monkeypatch,
                                                                           tmp_path):
    """What the existing states commit (a Keras model and its optimizer's slots, the epoch, a
    History-like list, the transparent fit's logs keyed by epoch, numpy values) is written by
    rank 0 with every rank waiting, and read back bitwise with the same Python types; the
    directory hpcrep creates is private (0700)."""
    r, _ = world
    directory = os.path.join(hvd.broadcast_object(str(tmp_path), 0), "made-by-hpcrep")
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", directory)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), verbose=0)
    attrs = dict(epoch=2, rows=0, seed=12345, history=[0.5, float("nan")],
                 logs={0: {"loss": 0.25}, 1: {"loss": 0.125, "val_loss": float("inf")}},
                 lr=np.float32(0.1), best=(1, "a"))
    state = hvd.elastic.TensorFlowKerasState(model, **attrs)
    state.sync()
    state.commit()  # rank 0 writes; no rank returns before the file is there
    if r == 0:
        assert os.stat(directory).st_mode & 0o777 == 0o700
        read = state.committed()
        assert read["attrs"].keys() == attrs.keys()
        for name, value in attrs.items():
            got = read["attrs"][name]
            assert type(got) is type(value) and repr(got) == repr(value), name
        assert type(read["attrs"]["lr"]) is np.float32
        expected = [np.asarray(v.numpy()) for v in state.variables()]
        assert len(read["values"]) == len(expected) > 2  # the optimizer's slots too
        for got, want in zip(read["values"], expected):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    hvd.barrier()


def test_an_attribute_a_commit_cannot_hold_raises_on_every_rank(world, monkeypatch, tmp_path):
    """A state attribute that is not plain data makes ``commit`` raise on rank 0, which writes,
    naming it, and on every other rank too (no rank is left waiting for rank 0)."""
    r, _ = world
    monkeypatch.setenv("HPCREP_ELASTIC_DIR", hvd.broadcast_object(str(tmp_path), 0))
    state = hvd.elastic.ObjectState(epoch=0, callback=print)
    expected = NotPlainDataError if r == 0 else RemoteError
    with pytest.raises(expected, match="attribute callback is a builtins.builtin_function"
                       if r == 0 else "rank 0 failed in writing the elastic commit"):
        state.commit()
    hvd.barrier()
