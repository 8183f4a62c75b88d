"""PowerSGD (``hvd.Compression.powersgd``) on real ranks: exact where the averaged gradient has
low rank, error feedback that keeps the sum of applied gradients on the true sum, the warm-up
switch, training through ``DistributedOptimizer`` (``fit``), ``DistributedGradientTape`` (in
``tf.function``), the Replicator and transparent mode, bitwise equal weights on every rank, and
state that round-trips through hpcrep's checkpoints. Passes at any number of ranks."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import CheckpointManager
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state
from hpcrep.tensorflow.powersgd import compresses

pytestmark = pytest.mark.timeout(240)
SIZE = hc.size()


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def reduce_once(compression, upstreams, variables):
    """The tape's reduced gradients of ``sum(v * u)`` (which are the ``upstreams``)."""
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v * u) for v, u in zip(variables, upstreams)])
    return hvd.DistributedGradientTape(tape, compression=compression).gradient(loss, variables)


def same_on_every_rank(arrays):
    """Assert every rank holds bitwise rank 0's ``arrays``."""
    everyone = hc.allgather_object([np.asarray(a) for a in arrays])
    for r, theirs in enumerate(everyone):
        for i, (a, b) in enumerate(zip(everyone[0], theirs)):
            np.testing.assert_array_equal(a, b, err_msg=f"array {i}: rank {r} != rank 0")


# options ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, fix", [
    (dict(rank=0), "must be 1 or more"), (dict(rank=-2), "must be 1 or more"),
    (dict(rank=1.5), "takes an int"), (dict(rank="2"), "takes an int"),
    (dict(rank=True), "takes an int"), (dict(rank=2, warmup_steps=-1), "warmup_steps"),
])
def test_bad_options_are_refused_with_the_fix(bad, fix):
    with pytest.raises(CollectiveArgumentError, match=fix):
        hvd.Compression.powersgd(**bad)


def test_uncalled_powersgd_and_other_ops_are_refused():
    opt = keras.optimizers.SGD(0.1)
    with pytest.raises(CollectiveArgumentError, match=r"call it, e\.g\."):
        hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd)
    with pytest.raises(CollectiveArgumentError, match="needs op=Average"):
        hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd(2), op=hvd.Sum)
    with pytest.raises(CollectiveArgumentError, match="needs op=Average"):
        hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd(2),
                                 gradient_predivide_factor=2.0)


def test_integer_gradients_are_refused():
    w = tf.Variable(tf.zeros([6, 5], tf.int32))
    with pytest.raises(CollectiveArgumentError, match="floating-point gradients"):
        hvd.Compression.powersgd(2).build([w])


def test_one_object_serves_one_set_of_variables():
    psgd = hvd.Compression.powersgd(1)
    reduce_once(psgd, [tf.ones([6, 5])], [tf.Variable(tf.zeros([6, 5]))])
    with pytest.raises(CollectiveArgumentError, match="its own Compression.powersgd"):
        reduce_once(psgd, [tf.ones([7, 5])], [tf.Variable(tf.zeros([7, 5]))])


# exactness --------------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_low_rank_average_is_reconstructed_exactly(world, rank):
    """Rank k's gradient is ``U diag(c_k) V^T`` (U, V shared, c_k its own): the average has rank
    ``rank`` at most, so P spans its columns and ``P P^T M`` is the average itself."""
    me, _ = world
    shape = (12, 3, 10)  # a 3-d kernel: compressed as [36, 10]
    assert compresses(shape, rank)
    rng = np.random.default_rng(7)
    u, v = rng.normal(size=(36, rank)), rng.normal(size=(10, rank))
    coef = lambda k, step: np.random.default_rng([k, step]).uniform(0.5, 2.0, rank)  # noqa: E731
    w, b = tf.Variable(tf.zeros(shape)), tf.Variable(tf.zeros([10]))
    psgd = hvd.Compression.powersgd(rank)
    for step in range(2):
        mats = [(u * coef(k, step)) @ v.T for k in range(SIZE)]
        bias = [np.full(10, k + step, np.float32) for k in range(SIZE)]
        gw, gb = reduce_once(psgd, [tf.constant(mats[me].reshape(shape), tf.float32),
                                    tf.constant(bias[me])], [w, b])
        np.testing.assert_allclose(gw.numpy().reshape(36, 10), np.mean(mats, axis=0),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(gb.numpy(), np.mean(bias, axis=0, dtype=np.float32))
        same_on_every_rank([gw, gb])
    assert int(psgd.step) == 2 and len(psgd.rank_local_variables()) == 1
    # Each rank keeps its own part of M beyond the average; their mean is what was left out.
    mean_error = hc.allreduce(psgd.rank_local_variables()[0].numpy(), op=hc.Average)
    assert np.abs(mean_error).max() < 1e-4


def test_matrices_where_factors_save_no_bytes_are_averaged_exactly(world):
    """[4, 3] at rank 2 (2 x 7 >= 12) and [16, 5] at rank 8 (above min(n, m)): uncompressed, so
    bitwise the plain average."""
    me, _ = world
    variables = [tf.Variable(tf.zeros([4, 3])), tf.Variable(tf.zeros([16, 5]))]
    ups = [tf.constant(np.random.default_rng([me, i]).normal(size=v.shape), tf.float32)
           for i, v in enumerate(variables)]
    plain = reduce_once(hvd.Compression.none, ups, variables)
    for rank in (2, 8):
        psgd = hvd.Compression.powersgd(rank)
        got = reduce_once(psgd, ups, variables)
        np.testing.assert_array_equal(got[0].numpy(), plain[0].numpy())
        if rank == 8:
            assert psgd.rank_local_variables() == []
            np.testing.assert_array_equal(got[1].numpy(), plain[1].numpy())
        else:
            assert len(psgd.rank_local_variables()) == 1  # only [16, 5] is compressed


# error feedback and warm-up -----------------------------------------------------------------

def test_error_feedback_keeps_the_sum_of_applied_gradients_on_the_true_sum(world):
    """Telescoping: sum over steps of G_hat = sum of true averages - average over ranks of the
    final E. Full-rank gradients at rank 1, so each step alone is far from the average."""
    me, _ = world
    w = tf.Variable(tf.zeros([20, 16]))
    psgd = hvd.Compression.powersgd(1)
    applied = np.zeros([20, 16])
    true = np.zeros([20, 16])
    worst_step_error = 0.0
    for step in range(25):
        mats = [np.random.default_rng([k, step, 3]).normal(size=(20, 16)).astype(np.float32)
                for k in range(SIZE)]
        got = reduce_once(psgd, [tf.constant(mats[me])], [w])[0].numpy()
        avg = np.mean(mats, axis=0)
        worst_step_error = max(worst_step_error, np.linalg.norm(got - avg) / np.linalg.norm(avg))
        applied += got
        true += avg
    error = psgd.rank_local_variables()[0].numpy()
    mean_error = hc.allreduce(error.astype(np.float64), op=hc.Average)
    np.testing.assert_allclose(applied + mean_error, true, atol=2e-4)
    assert worst_step_error > 0.3  # rank 1 of a 20 x 16 noise matrix is a poor step alone
    # ... but what the applied sum lags by stays bounded: the mean error grows until the top
    # direction of M takes out about one gradient's energy a step, near sqrt(min(n, m)) = 4
    # gradients' norm for noise like this (each rank's own E also carries the running sum of its
    # gradients' differences from the mean, which only the mean cancels).
    ratio = np.linalg.norm(mean_error) / np.linalg.norm(avg)
    print(f"mean error / averaged gradient: {ratio:.2f}")
    assert ratio < 5, ratio


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_non_finite_gradient_on_one_rank_leaves_every_ranks_state_as_it_was(world, traced):
    """An overflow on the last rank reaches every rank through the averaged factors: the step's
    result is non-finite everywhere (a LossScaleOptimizer skips it) and every rank keeps its E
    and Q as they were, so later steps carry no inf/NaN."""
    me, n = world
    w = tf.Variable(tf.zeros([12, 10]))
    psgd = hvd.Compression.powersgd(2)
    rng = np.random.default_rng([me, 7])
    reduce = tf.function(reduce_once, autograph=False) if traced else reduce_once

    def upstream(bad: bool) -> tf.Tensor:
        u = rng.normal(size=(12, 10)).astype(np.float32)
        if bad and me == n - 1:
            u[3, 4] = np.inf
        return tf.constant(u)

    reduce(psgd, [upstream(False)], [w])
    before = [v.numpy() for v in psgd.rank_local_variables() + psgd.replicated_variables()[1:]]
    assert np.any(before[0] != 0)  # the first step left an error behind
    got = reduce(psgd, [upstream(True)], [w])[0].numpy()
    assert not np.all(np.isfinite(got))
    after = [v.numpy() for v in psgd.rank_local_variables() + psgd.replicated_variables()[1:]]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert int(psgd.step.numpy()) == 2  # the step still counts
    healthy = reduce(psgd, [upstream(False)], [w])[0].numpy()
    assert np.all(np.isfinite(healthy))
    same_on_every_rank([healthy] + [v.numpy() for v in psgd.replicated_variables()])


def test_warmup_averages_uncompressed_then_switches_at_the_right_step(world):
    me, _ = world
    w = tf.Variable(tf.zeros([12, 9]))
    psgd = hvd.Compression.powersgd(1, warmup_steps=3)

    @tf.function
    def step(upstream):
        return reduce_once(psgd, [upstream], [w])[0]

    for s in range(5):
        mine = tf.constant(np.random.default_rng([me, s]).normal(size=(12, 9)), tf.float32)
        got = step(mine).numpy()
        plain = reduce_once(hvd.Compression.none, [mine], [w])[0].numpy()
        error = psgd.rank_local_variables()[0].numpy()
        if s < 3:
            np.testing.assert_array_equal(got, plain, err_msg=f"step {s}: not uncompressed")
            assert not error.any(), f"step {s}: error feedback began during the warm-up"
        else:
            assert np.linalg.matrix_rank(got, tol=1e-4) == 1, f"step {s}: not compressed"
            assert np.abs(error).max() > 1e-3, f"step {s}"
        assert int(psgd.step) == s + 1


# training ---------------------------------------------------------------------------------------

def regression_data(me, rows=64):
    rng = np.random.default_rng([11, me])
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    w_true = np.random.default_rng(5).normal(size=(8, 1)).astype(np.float32)
    return x, np.tanh(x @ w_true) + 0.5 * x[:, :1]


def small_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])


def fit_losses(me, compression, epochs=12):
    x, y = regression_data(me)
    model = small_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compression)
    model.compile(opt, loss="mse", jit_compile=False)
    hist = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return hist.history["loss"], model, opt


def test_keras_fit_trains_like_uncompressed_with_equal_weights_everywhere(world):
    me, _ = world
    psgd = hvd.Compression.powersgd(2, warmup_steps=4)
    losses, model, opt = fit_losses(me, psgd)
    plain, _, _ = fit_losses(me, hvd.Compression.none)
    assert losses[-1] < 0.3 * losses[0], losses
    assert losses[-1] < 1.5 * plain[-1] + 0.02, (losses[-1], plain[-1])
    same_on_every_rank(model.get_weights() + [v.numpy() for v in opt.variables])
    names = [v.name for v in opt.variables]
    assert names.count("powersgd_q") == 2 and "powersgd_step" in names, names  # two 16-wide
    assert int(psgd.step) == 12 * 4 and int(opt.iterations) == 12 * 4


def test_tape_in_tf_function_trains_with_equal_weights_everywhere(world):
    me, _ = world
    x, y = regression_data(me)
    model = small_model()
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    psgd = hvd.Compression.powersgd(2)
    psgd.build(model.trainable_variables, opt)  # the optimizer carries the state
    assert len(opt.variables) > 2 and psgd.step is opt.variables[2]

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        grads = hvd.DistributedGradientTape(tape, compression=psgd).gradient(
            loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    losses = [float(train_step(x[i:i + 16], y[i:i + 16]))
              for _ in range(12) for i in range(0, 64, 16)]
    assert np.mean(losses[-4:]) < 0.3 * np.mean(losses[:4]), losses
    same_on_every_rank(model.get_weights() + [v.numpy() for v in opt.variables])
    assert int(psgd.step) == 48


def test_replicator_wrap_optimizer_takes_powersgd(world):
    from hpcrep.replicator import Replicator
    psgd = hvd.Compression.powersgd(2)
    rep = Replicator()
    opt = rep.wrap_optimizer(keras.optimizers.SGD(0.1), compression=psgd)
    model = small_model()
    opt.build(model.trainable_variables)
    assert psgd.built and len(psgd.rank_local_variables()) == 2
    x, y = regression_data(world[0], 16)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert int(psgd.step) == 1
    same_on_every_rank(model.get_weights())
    rep.close()


def test_transparent_mode_setting_compresses_every_optimizer(world, monkeypatch):
    from hpcrep.tensorflow import transparent
    from hpcrep.tensorflow.powersgd import carried_by
    me, _ = world
    monkeypatch.setenv("HPCREP_COMPRESSION", "powersgd:2:3")
    x, y = regression_data(me)
    with transparent(announce=False):
        model = small_model()
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        model.fit(np.tile(x, (SIZE, 1)), np.tile(y, (SIZE, 1)), batch_size=16, epochs=2,
                  verbose=0, shuffle=False)
        psgd = carried_by(model.optimizer)
    assert psgd is not None and (psgd.rank, psgd.warmup_steps) == (2, 3)
    assert int(psgd.step) == 2 * 4 and np.abs(psgd.rank_local_variables()[0].numpy()).max() > 0
    same_on_every_rank(model.get_weights())


# checkpoints ----------------------------------------------------------------------------------

def test_state_round_trips_through_a_checkpoint(world, shared_dir):
    """Save after 5 steps, go on 5 more; a fresh model and optimizer restored from the save and
    trained the same 5 steps ends bitwise equal, its error buffers included (each rank its own)."""
    me, _ = world
    x, y = regression_data(me)

    def setup():
        model = small_model()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                       compression=hvd.Compression.powersgd(1, warmup_steps=2))
        opt.build(model.trainable_variables)
        return model, opt

    def steps(model, opt, first, count):
        for s in range(first, first + count):
            xb, yb = x[(s % 4) * 16:(s % 4 + 1) * 16], y[(s % 4) * 16:(s % 4 + 1) * 16]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    from hpcrep.tensorflow.powersgd import carried_by
    model, opt = setup()
    steps(model, opt, 0, 5)
    manager = CheckpointManager(shared_dir)
    manager.save(training_state(model, opt), step=5)
    steps(model, opt, 5, 5)
    errors = [e.numpy() for e in carried_by(opt).rank_local_variables()]
    if SIZE > 1:  # the buffers differ between ranks: each must get its own back
        theirs = hc.allgather_object(errors[0])
        assert not np.array_equal(theirs[0], theirs[1])

    model2, opt2 = setup()
    load_training_state(manager.restore(), model2, opt2)
    assert int(carried_by(opt2).step) == 5
    steps(model2, opt2, 5, 5)
    for a, b in zip(model.get_weights() + [v.numpy() for v in opt.variables],
                    model2.get_weights() + [v.numpy() for v in opt2.variables]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(errors, carried_by(opt2).rank_local_variables()):
        np.testing.assert_array_equal(a, b.numpy())
