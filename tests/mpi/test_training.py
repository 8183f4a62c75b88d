"""DistributedOptimizer, DistributedGradientTape, callbacks and SyncBatchNormalization train a small
model on 4 ranks exactly as one process trains it on the combined batch."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
import hpcrep.tensorflow.keras as hvdk
from hpcrep.errors import CollectiveArgumentError

K, B, FEATURES = 6, 8, 5


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def make_model(seed=7, batch_norm=None):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="tanh")]
    if batch_norm is not None:
        layers.append(batch_norm())
    layers += [keras.layers.Dense(1)]
    return keras.Sequential(layers)


def global_data(n):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(K * n * B, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype("float32")
    return x, y


def step_slices(step, n, r):
    """Rows of step `step`: all n*B of them, and this rank's B."""
    start = step * n * B
    return slice(start, start + n * B), slice(start + r * B, start + (r + 1) * B)


def train_reference(x, y, n, lr, batch_norm=None, seed=7):
    model = make_model(seed=seed, batch_norm=batch_norm)
    opt = keras.optimizers.SGD(lr, momentum=0.9)
    for step in range(K):
        whole, _ = step_slices(step, n, 0)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[whole], training=True) - y[whole]))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return model


def assert_same_on_all_ranks(weights):
    gathered = hvd.allgather_object([np.asarray(w) for w in weights])
    for other in gathered[1:]:
        for a, b in zip(gathered[0], other):
            np.testing.assert_array_equal(a, b)


def assert_matches(model, reference, rtol=2e-5, atol=2e-6):
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("compile_step", [False, True])
def test_custom_loop_matches_single_process(world, compile_step):
    r, n = world
    x, y = global_data(n)
    model = make_model(seed=100 + r)  # different starting weights on purpose
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    step = tf.function(step) if compile_step else step
    for k in range(K):
        _, mine = step_slices(k, n, r)
        step(x[mine], y[mine])
    assert_same_on_all_ranks(model.get_weights())
    # After the broadcast every rank starts from rank 0's weights (seed 100).
    assert_matches(model, train_reference(x, y, n, 0.05, seed=100))


def test_model_fit_matches_single_process(world):
    r, n = world
    x, y = global_data(n)
    mine = np.concatenate([np.arange(*step_slices(k, n, r)[1].indices(len(x))) for k in range(K)])
    model = make_model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "mse")
    history = model.fit(x[mine], y[mine], batch_size=B, epochs=1, shuffle=False, verbose=0,
                        callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvdk.callbacks.MetricAverageCallback()])
    assert model.optimizer.__class__.__name__ == "SGD"
    assert_same_on_all_ranks(model.get_weights())
    assert_matches(model, train_reference(x, y, n, 0.05))
    losses = hvd.allgather_object(history.history["loss"][0])
    assert len(set(losses)) == 1, losses  # averaged across ranks


def test_distributed_gradient_tape_matches(world):
    r, n = world
    x, y = global_data(n)
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    for k in range(K):
        _, mine = step_slices(k, n, r)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[mine]) - y[mine]))
        tape = hvd.DistributedGradientTape(tape)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert_same_on_all_ranks(model.get_weights())
    assert_matches(model, train_reference(x, y, n, 0.05))


def test_backward_passes_per_step(world):
    """Two half-batches accumulated per step equal one step on the whole batch (averaged)."""
    r, n = world
    x, y = global_data(n)
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                   backward_passes_per_step=2, average_aggregated_gradients=True)

    @tf.function
    def half_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for k in range(K):
        _, mine = step_slices(k, n, r)
        rows = np.arange(len(x))[mine]
        half_step(x[rows[: B // 2]], y[rows[: B // 2]])
        half_step(x[rows[B // 2:]], y[rows[B // 2:]])
    assert int(opt.iterations) == K
    assert_same_on_all_ranks(model.get_weights())
    assert_matches(model, train_reference(x, y, n, 0.05))


def test_backward_passes_need_the_variables_until_built(world):
    """Gradients are summed per variable, so apply(grads) alone on an unbuilt optimizer raises
    on every rank before any exchange; once Keras's build has run, it accumulates and applies."""
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    with pytest.raises(CollectiveArgumentError, match="needs a built optimizer"):
        opt.apply(grads)
    opt.build(model.trainable_variables)
    before = [v.numpy() for v in model.trainable_variables]
    opt.apply(grads)
    opt.apply(grads)
    assert int(opt.iterations) == 1
    for v, b in zip(model.trainable_variables, before):
        np.testing.assert_allclose(v.numpy(), b - 0.1 * 2, rtol=1e-6)  # summed: 2 passes of 1


def accumulating(seed):
    """A model and a DistributedOptimizer summing 2 passes per apply, built, and its pass."""
    model = make_model(seed)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                   backward_passes_per_step=2)
    opt.build(model.trainable_variables)

    @tf.function(jit_compile=False)
    def half_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    return model, opt, half_step


def halves(x, n, r):
    """This rank's half-batches, two per step."""
    out = []
    for k in range(K):
        rows = np.arange(len(x))[step_slices(k, n, r)[1]]
        out += [rows[: B // 2], rows[B // 2:]]
    return out


def full_state(model, opt):
    from hpcrep.tensorflow.optimizer import accumulation_variables

    return [np.asarray(v.numpy()) for v in (model.weights + opt.variables
                                            + accumulation_variables(opt))]


@pytest.mark.timeout(180)
def test_backward_passes_resume_mid_accumulation_equals_uninterrupted(world, shared_dir):
    """A checkpoint between two applies holds every rank's partial sums and the pass counter:
    restored into a fresh model and optimizer, the run goes on bit for bit as if never stopped."""
    from hpcrep.checkpoint import CheckpointManager
    from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state

    r, n = world
    x, y = global_data(n)
    passes = halves(x, n, r)
    stop = 2 * (K // 2) + 1  # odd: one pass summed, not yet applied

    straight, straight_opt, straight_step = accumulating(seed=7)
    for rows in passes:
        straight_step(x[rows], y[rows])

    first, first_opt, first_step = accumulating(seed=7)
    for rows in passes[:stop]:
        first_step(x[rows], y[rows])
    assert int(first_opt.iterations) == stop // 2
    manager = CheckpointManager(shared_dir)
    manager.save(training_state(first, first_opt), step=stop)
    saved = full_state(first, first_opt)

    resumed, resumed_opt, resumed_step = accumulating(seed=50 + r)  # a fresh process's weights
    load_training_state(manager.restore(), resumed, resumed_opt)
    restored = full_state(resumed, resumed_opt)
    assert len(restored) == len(saved) == 4 + 2 + 4 + 1 + 4
    for a, b in zip(restored, saved):
        np.testing.assert_array_equal(a, b)
    assert int(restored[-5]) == stop and np.abs(restored[-1]).max() > 0  # mid-accumulation
    for rows in passes[stop:]:
        resumed_step(x[rows], y[rows])
    assert int(resumed_opt.iterations) == int(straight_opt.iterations) == K
    assert_same_on_all_ranks(resumed.get_weights())
    for a, b in zip(full_state(resumed, resumed_opt), full_state(straight, straight_opt)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(180)
def test_backward_passes_fit_resumes_mid_accumulation_with_checkpoint_callback(world,
                                                                             shared_dir):
    """fit with 3 batches an epoch and 2 passes per apply ends epoch 1 mid-accumulation: the
    CheckpointCallback's checkpoint resumes epoch 2 exactly as the uninterrupted fit runs it."""
    from hpcrep.tensorflow.checkpoint_callback import CheckpointCallback

    r, n = world
    x, y = global_data(n)
    mine = np.arange(len(x))[r::n][:3 * B]

    def compiled(seed):
        model = make_model(seed)
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                               backward_passes_per_step=2), "mse",
                      jit_compile=False)
        return model

    def fit(model, epochs, initial_epoch=0, callbacks=()):
        model.fit(x[mine], y[mine], batch_size=B, epochs=epochs, initial_epoch=initial_epoch,
                  shuffle=False, verbose=0,
                  callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])

    straight = compiled(7)
    fit(straight, epochs=2)
    first = compiled(7)
    fit(first, epochs=1, callbacks=[CheckpointCallback(shared_dir, signum=None)])
    assert int(first.optimizer.iterations) == 1  # 3 passes: one applied, one summed
    resumed = compiled(50 + r)
    cb = CheckpointCallback(shared_dir, signum=None)
    assert cb.restore(resumed) == 1
    fit(resumed, epochs=2, initial_epoch=1, callbacks=[cb])
    assert int(resumed.optimizer.iterations) == int(straight.optimizer.iterations) == 3
    assert_same_on_all_ranks(resumed.get_weights())
    for a, b in zip(full_state(resumed, resumed.optimizer),
                    full_state(straight, straight.optimizer)):
        np.testing.assert_array_equal(a, b)


def test_sync_batch_norm_matches_global_batch(world):
    r, n = world
    x, y = global_data(n)
    model = make_model(batch_norm=hvd.SyncBatchNormalization)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    for k in range(K):
        _, mine = step_slices(k, n, r)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[mine], training=True) - y[mine]))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert_same_on_all_ranks(model.get_weights())  # moving statistics included
    reference = train_reference(x, y, n, 0.05, batch_norm=keras.layers.BatchNormalization)
    assert_matches(model, reference, rtol=1e-4, atol=1e-5)


def test_saved_model_loads_without_hpcrep(world, tmp_path_factory):
    r, n = world
    model = make_model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "mse")
    x, y = global_data(n)
    model.fit(x[:B], y[:B], batch_size=B, verbose=0)
    path = os.path.join(str(tmp_path_factory.mktemp(f"save{r}")), "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.Adam
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_learning_rate_warmup_schedule(world):
    r, n = world
    cb = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2,
                                                   steps_per_epoch=10)
    assert cb.rate_at(0.0) == pytest.approx(0.4 / n)
    assert cb.rate_at(2.0) == pytest.approx(0.4)
    assert cb.rate_at(1.0) == pytest.approx(0.4 / n * ((n - 1) / 2 + 1))


def test_learning_rate_warmup_changes_the_rate_fit_trains_at(world):
    """During ``fit`` the warm-up callback raises the rate batch by batch, and each update uses
    it: one bias-free unit trained on the mean of its output has gradient 1 per kernel entry
    (inputs of ones), so the kernel moves by exactly the rate at every step."""
    r, n = world
    steps, epochs, warmup, lr = 4, 3, 2, 0.4
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer="zeros")])
    model.compile(hvdk.DistributedOptimizer(keras.optimizers.SGD(lr)),
                  loss=lambda y_true, y_pred: keras.ops.mean(y_pred))
    rates, moves, before = [], [], []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: (
            rates.append(float(np.asarray(model.optimizer.learning_rate))),
            before.append(model.get_weights()[0][0, 0])),
        on_train_batch_end=lambda b, logs: moves.append(before[-1] - model.get_weights()[0][0, 0]))
    warm = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=warmup)
    model.fit(np.ones((steps * 2, 2), np.float32), np.zeros((steps * 2, 1), np.float32),
              batch_size=2, epochs=epochs, shuffle=False, verbose=0, callbacks=[warm, record])
    expected = [lr / n * ((e + (b + 1) / steps) * (n - 1) / warmup + 1) if e < warmup else lr
                for e in range(epochs) for b in range(steps)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    np.testing.assert_allclose(moves, expected, rtol=1e-5)  # the updates used those rates
    if n > 1:  # warm-up exists to start below the full rate: it rises during fit
        assert rates[0] < rates[steps] < rates[2 * steps] == pytest.approx(lr)
