"""hvd.elastic without a driver: commit/restore/sync of object, TensorFlow and Keras states
(Horovod test_tensorflow.py::test_elastic_state) and @hvd.elastic.run."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd

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
