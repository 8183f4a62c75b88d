"""The Horovod API hpcrep was missing: topology ops and flags, in-place broadcast,
local (model-parallel) variables in tapes, optimizers and the broadcast callback, and the
learning-rate schedule callback."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
import hpcrep.tensorflow.keras as hvdk

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def test_topology_ops_eagerly_and_in_tf_function(world):
    """Horovod test_horovod_rank_op / local_rank_op / size_op / local_size_op."""
    r, n = world

    def ops():
        return (hvd.rank_op(), hvd.local_rank_op(), hvd.size_op(), hvd.local_size_op(),
                hvd.process_set_included_op())

    for values in (ops(), tf.function(ops)()):
        assert all(v.dtype == tf.int32 and v.shape == [] for v in values)
        assert [int(v) for v in values] == [r, hvd.local_rank(), n, hvd.local_size(), 1]
    if n >= 2:  # Horovod's process-set forms: a set of the even ranks
        evens = hvd.add_process_set(list(range(0, n, 2)))
        try:
            size, included = hvd.size_op(evens.process_set_id), hvd.process_set_included_op(
                evens.process_set_id)
            assert (int(size), int(included)) == (len(range(0, n, 2)), int(r % 2 == 0))
        finally:
            hvd.remove_process_set(evens)
    with pytest.raises(ValueError, match="no process set has id 99"):
        hvd.size_op(process_set_id=99)


def test_built_and_enabled_flags():
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert not any([hvd.gloo_built(), hvd.gloo_enabled(), hvd.nccl_built(), hvd.ccl_built(),
                    hvd.ddl_built(), hvd.cuda_built(), hvd.rocm_built()])
    # Horovod's gpu_available (its Adasum GPU test asks it): this machine's GPUs, as TF sees them
    assert hvd.gpu_available("tensorflow") == bool(tf.config.list_physical_devices("GPU"))


def test_broadcast_in_place_eagerly_and_in_tf_function(world):
    """Horovod broadcast_: variables take the root's values; the new values are returned."""
    r, n = world
    root = n - 1
    a = tf.Variable(tf.fill([3], float(r)))
    b = tf.Variable(r * 10, dtype=tf.int64)
    values = hvd.broadcast_([a, b], root_rank=root)
    np.testing.assert_array_equal(a, np.full(3, root))
    assert int(b) == 10 * root and int(values[1]) == 10 * root
    a.assign(tf.fill([3], float(r) + 0.5))
    values = tf.function(lambda: hvd.broadcast_([a], root_rank=0))()
    np.testing.assert_array_equal(values[0], np.full(3, 0.5))
    np.testing.assert_array_equal(a, np.full(3, 0.5))
    k = keras.Variable(np.full([2], float(r)))
    hvd.broadcast_([k], 0)
    np.testing.assert_array_equal(k.numpy(), np.zeros(2))


def test_broadcast_object_fn(world):
    """Horovod test_broadcast_object_fn: the returned function broadcasts from root_rank."""
    r, n = world
    bcast = hvd.broadcast_object_fn(root_rank=n - 1)
    assert bcast({"from": r}) == {"from": n - 1}


def _two_layer_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="shared"),
                              keras.layers.Dense(1, name="local")])
    return model


def _loss(model, r):
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) + r)
    return tf.reduce_sum(model(x) ** 2)


def _local_reference(model, r, n):
    """Per-rank gradients, the average of the shared ones, and the local ones divided by n."""
    with tf.GradientTape() as tape:
        loss = _loss(model, r)
    mine = tape.gradient(loss, model.trainable_variables)
    everyone = hvd.allgather_object([g.numpy() for g in mine])
    shared = [np.mean([e[i] for e in everyone], axis=0) for i in range(2)]
    return shared + [g.numpy() / n for g in mine[2:]]


@pytest.mark.parametrize("partial", [False, True])
def test_tape_local_sources_are_not_reduced(world, partial):
    """Horovod DistributedGradientTape.register_local_source / PartialDistributedGradientTape:
    local gradients stay on the rank, divided by size (scale_local_gradients=True)."""
    r, n = world
    model = _two_layer_model(0)
    expected = _local_reference(model, r, n)
    with tf.GradientTape() as tape:
        loss = _loss(model, r)
    if partial:
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=model.get_layer("local"))
    else:
        tape = hvd.DistributedGradientTape(tape)
        for v in model.get_layer("local").trainable_weights:
            tape.register_local_source(v)
    grads = tape.gradient(loss, model.trainable_variables)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5)
    with tf.GradientTape() as unscaled:
        loss = _loss(model, r)
    unscaled = hvd.PartialDistributedGradientTape(unscaled, local_layers=[model.get_layer("local")],
                                                  scale_local_gradients=False)
    grads = unscaled.gradient(loss, model.trainable_variables)
    np.testing.assert_allclose(grads[2], expected[2] * n, rtol=1e-5)
    with pytest.raises(ValueError, match="Keras layers"):
        hvd.PartialDistributedGradientTape(tape, local_layers=["dense"])


def test_tape_get_local_and_global_gradients(world):
    """Horovod test_partial_distributed_gradient_tape's get_local_and_global_gradients: the
    (source, gradient) pairs of the local layer (its gradient / size) and of the shared one
    (averaged), in the sources' order; use_generic_names is accepted."""
    r, n = world
    model = _two_layer_model(0)
    expected = _local_reference(model, r, n)
    with tf.GradientTape(persistent=True) as tape:
        loss = _loss(model, r)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.get_layer("local")])
    local, shared = tape.get_local_and_global_gradients(loss, model.trainable_variables,
                                                        use_generic_names=True)
    variables = model.trainable_variables
    assert [v for v, _ in shared] == variables[:2] and [v for v, _ in local] == variables[2:]
    for (_, g), e in zip(shared + local, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5)


def test_sync_batch_norm_takes_horovods_fused_argument():
    """Horovod's SyncBatchNormalization(fused=False) (its default) builds; fused=True or None
    is refused with ValueError, as in Horovod. Keras 3's own BatchNormalization has no fused=."""
    layer = hvd.SyncBatchNormalization(axis=1, fused=False)
    assert "fused" not in layer.get_config()
    for fused in (True, None):
        with pytest.raises(ValueError, match="does not support fused"):
            hvd.SyncBatchNormalization(fused=fused)


def test_partial_distributed_optimizer_keeps_local_layers_apart(world):
    """hpcrep.tensorflow.keras.PartialDistributedOptimizer / register_local_var: shared weights
    end equal on every rank, local ones differ and move by their own gradient / size."""
    r, n = world
    model = _two_layer_model(0)
    expected = _local_reference(model, r, n)
    before = [v.numpy() for v in model.trainable_variables]
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                           local_layers=model.get_layer("local"))
    with tf.GradientTape() as tape:
        loss = _loss(model, r)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)
    for v, b, e in zip(model.trainable_variables, before, expected):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * e, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather_object([v.numpy() for v in model.trainable_variables])
    for other in gathered[1:]:
        np.testing.assert_array_equal(other[0], gathered[0][0])
        if n > 1:
            assert not np.array_equal(other[2], gathered[0][2])
    plain = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    plain.register_local_var(model.get_layer("local").kernel)
    assert len(plain._hpcrep_reducer.local) == 1


def test_broadcast_callback_leaves_local_variables_alone(world):
    """Horovod BroadcastGlobalVariablesCallback(local_variables=...): not broadcast."""
    r, n = world
    model = _two_layer_model(10 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    local = model.get_layer("local").trainable_weights
    local_before = [v.numpy() for v in local]
    cb = hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=local)
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"), batch_size=4, epochs=1,
              verbose=0, callbacks=[cb])
    for v, b in zip(local, local_before):
        np.testing.assert_array_equal(v.numpy(), b)  # lr 0: untouched, not overwritten
    shared = hvd.allgather_object([v.numpy() for v in model.get_layer("shared").weights])
    for other in shared[1:]:
        for a, b in zip(other, shared[0]):
            np.testing.assert_array_equal(a, b)


def _fit_recording_lr(callbacks, epochs=3, steps=4, lr=1.0):
    model = _two_layer_model(0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(
            float(np.asarray(model.optimizer.learning_rate))))
    history = model.fit(np.ones((4 * steps, 3), "float32"), np.ones((4 * steps, 1), "float32"),
                        batch_size=4, epochs=epochs, verbose=0, callbacks=[*callbacks, record])
    return np.array(seen).reshape(epochs, steps), history


def test_learning_rate_schedule_staircase_and_smooth(world):
    """Horovod LearningRateScheduleCallback: initial_lr * multiplier(epoch) inside
    [start_epoch, end_epoch), per epoch (staircase) or per batch (fractional epoch)."""
    seen, history = _fit_recording_lr([hvdk.callbacks.LearningRateScheduleCallback(
        initial_lr=0.8, multiplier=0.5, start_epoch=1, end_epoch=3)])
    np.testing.assert_allclose(seen, [[1.0] * 4, [0.8] * 4, [0.4] * 4], rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], [1.0, 0.8, 0.4], rtol=1e-6)
    seen, _ = _fit_recording_lr([hvdk.callbacks.LearningRateScheduleCallback(
        initial_lr=None, multiplier=lambda e: 1.0 + e, staircase=False)], epochs=2)
    np.testing.assert_allclose(seen, [[1 + e + b / 4 for b in range(4)] for e in range(2)],
                               rtol=1e-6)


def test_learning_rate_warmup_follows_horovods_per_batch_rate(world):
    """Horovod LearningRateWarmupCallback: before batch b of epoch e (e < warmup_epochs) the rate
    is lr / size * ((e + (b + 1) / steps) * (size - 1) / warmup + 1); then it is left alone."""
    _, n = world
    seen, history = _fit_recording_lr([hvdk.callbacks.LearningRateWarmupCallback(
        initial_lr=0.8, warmup_epochs=2)], epochs=3, lr=0.8)
    expected = [[0.8 / n * ((e + (b + 1) / 4) * (n - 1) / 2 + 1) for b in range(4)]
                for e in range(2)] + [[0.8] * 4]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], [0.8 / n * ((n - 1) / 2 + 1), 0.8, 0.8],
                               rtol=1e-6)
