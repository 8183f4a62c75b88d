"""The replica canary (``HPCREP_CHECK_REPLICAS``): a drift planted on the highest rank (1e-3
added to one kernel, once) is reported on every rank within N steps, naming the variable, the
rank and the magnitude; abort raises everywhere, rebroadcast makes the weights bitwise equal,
NaN is named, batch-norm statistics are information, and a check never changes results.

At one rank nothing can differ: the drift tests then assert that nothing is reported (the
planted change is not a difference between ranks)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.errors import ReplicaDivergenceError
from hpcrep.tensorflow import transparent
from hpcrep.tensorflow.replica_report import ranks_text

pytestmark = pytest.mark.timeout(240)
EVERY, PLANT_AT, STEPS = 3, 4, 7  # drift after step 4: the check at step 6 must catch it
PREFIX = "hpcrep replica check"


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


@pytest.fixture
def canary(monkeypatch):
    """Check every EVERY steps with ``action`` (set before anything traces)."""
    def set_action(action="warn", every=EVERY):
        monkeypatch.setenv("HPCREP_CHECK_REPLICAS", str(every))
        monkeypatch.setenv("HPCREP_CHECK_REPLICAS_ACTION", action)
    return set_action


def model_and_data(rank, bn=False):
    keras.utils.set_random_seed(7)  # the same initial weights on every rank
    layers = [keras.Input((4,)), keras.layers.Dense(3, name="first")]
    if bn:
        layers.append(keras.layers.BatchNormalization(name="bn"))
    model = keras.Sequential(layers + [keras.layers.Dense(1, name="last")], name="net")
    x = np.random.default_rng(rank).random((8, 4)).astype(np.float32)  # each rank its own rows
    return model, x, x.sum(axis=1, keepdims=True)


def explicit_step(model, opt, x, y, compiled):
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss
    return tf.function(step) if compiled else step


def plant(model, rank, size, value=1e-3):
    """The highest rank adds ``value`` to every entry of the first kernel, once."""
    if rank == size - 1 and size > 1:
        kernel = model.get_layer("first").kernel
        kernel.assign(kernel + value)


def agreeing(n):
    """How the report names the ranks 0 .. n - 2 that hold rank 0's value."""
    return f"{ranks_text(list(range(n - 1)))} agree" if n > 2 else "rank 0 alone"


def report_lines(capfd):
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith(PREFIX)]


def train_with_drift(model, opt, x, y, compiled, world, value=1e-3):
    r, n = world
    step = explicit_step(model, opt, x, y, compiled)
    for i in range(1, STEPS + 1):
        step()
        if i == PLANT_AT:
            plant(model, r, n, value)


def same_everywhere(arrays):
    everyone = hvd.allgather_object([np.asarray(a).tobytes() for a in arrays])
    return all(e == everyone[0] for e in everyone)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_planted_drift_is_reported_within_n_steps(world, canary, capfd, compiled):
    r, n = world
    canary("warn")
    model, x, y = model_and_data(r)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    opt.build(model.trainable_variables)
    capfd.readouterr()
    train_with_drift(model, opt, x, y, compiled, world)
    lines = report_lines(capfd)
    if n == 1:
        assert lines == []
        return
    assert lines == [
        f"{PREFIX}, step 6: 1 of 4 trainable variables differ across ranks (action: warn): "
        f"net/first/kernel: {agreeing(n)}, rank {n - 1} differs, max |x - x[rank 0]| = 1.0e-03"]


def test_a_tape_loop_checks_with_check_replicas(world, capfd):
    """DistributedGradientTape has no step count every rank shares, so a tape loop with a plain
    optimizer checks explicitly: hvd.check_replicas finds the drift and names it."""
    r, n = world
    model, x, y = model_and_data(r)
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    capfd.readouterr()
    for i in range(1, STEPS + 1):
        step()
        if i == PLANT_AT:
            plant(model, r, n)
    assert report_lines(capfd) == []  # nothing automatic on this path
    result = hvd.check_replicas(model, opt, action="warn")
    lines = report_lines(capfd)
    if n == 1:
        assert result.agree and lines == []
        return
    assert not result.agree and result.differing == ("net/first/kernel",), result
    assert len(lines) == 1 and f"rank {n - 1} differs, max |x - x[rank 0]| = 1.0e-03" in lines[0]


def test_transparent_fit_is_checked_once_per_step(world, canary, capfd):
    r, n = world
    canary("warn", every=1)
    model, x, y = model_and_data(0)
    xs, ys = np.tile(x, (n, 1)), np.tile(y, (n, 1))
    drift = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: plant(model, r, n) if batch == 1 else None)
    with transparent(announce=False):
        # A DistributedOptimizer inside transparent mode applies through the patched apply:
        # nested applies, one check.
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
        capfd.readouterr()
        model.fit(xs, ys, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[drift])
    lines = report_lines(capfd)
    if n == 1:
        assert lines == []
        return
    steps = [int(re.match(rf"{PREFIX}, step (\d+):", line).group(1)) for line in lines]
    assert steps == [3, 4], lines  # batches 3 and 4 (steps 3, 4), one line each
    assert all(f"rank {n - 1} differs, max |x - x[rank 0]| = 1.0e-03" in line for line in lines)
    assert all("net/first/kernel" in line for line in lines)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_abort_raises_on_every_rank(world, canary, compiled):
    r, n = world
    if n < 2:
        pytest.skip("a divergence needs at least 2 ranks (this run has 1)")
    canary("abort")
    model, x, y = model_and_data(r)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    opt.build(model.trainable_variables)
    expected = ReplicaDivergenceError if not compiled else tf.errors.OpError
    with pytest.raises(expected, match="replicas diverged .* net/first/kernel"):
        train_with_drift(model, opt, x, y, compiled, world)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_rebroadcast_makes_the_weights_bitwise_equal(world, canary, capfd, compiled):
    r, n = world
    canary("rebroadcast")
    model, x, y = model_and_data(r)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    opt.build(model.trainable_variables)
    capfd.readouterr()
    train_with_drift(model, opt, x, y, compiled, world)
    assert same_everywhere(model.get_weights() + [v.numpy() for v in opt.variables])
    lines = report_lines(capfd)
    if n > 1:
        assert len(lines) == 2 and "rebroadcasting rank 0's values" in lines[1]
        assert hvd.check_replicas(model, opt).agree


def test_nan_on_one_rank_is_reported_as_nan(world, canary, capfd):
    r, n = world
    canary("warn")
    model, x, y = model_and_data(r)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    opt.build(model.trainable_variables)
    # NaN in a weight would reach every rank through the averaged gradient; NaN in one rank's
    # momentum stays there (and makes that rank's bias NaN at the next update).
    momentum = next(v for v in opt.variables if v.path.endswith("last_bias_momentum"))
    capfd.readouterr()
    step = explicit_step(model, opt, x, y, True)
    for i in range(1, EVERY + 1):
        if i == EVERY and r == n - 1:
            momentum.assign(tf.fill(momentum.shape, np.nan))
        step()
    lines = report_lines(capfd)
    where = "every rank" if n == 1 else f"rank {n - 1}"
    assert f"{PREFIX}, step 3: net/last/bias holds NaN or inf on {where}" in lines, lines
    if n > 1:
        assert lines[0].startswith(f"{PREFIX}, step 3: 1 of 4 trainable variables and 1 of ")
        assert (f"{PREFIX}, step 3: net/last/bias: {agreeing(n)}, rank {n - 1} differs, "
                "max |x - x[rank 0]| = NaN") in lines, lines


def test_batch_norm_statistics_are_information_reported_once(world, canary, capfd):
    r, n = world
    canary("abort", every=2)  # a difference counted as an error would raise
    model, x, y = model_and_data(r, bn=True)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    opt.build(model.trainable_variables)
    from hpcrep.tensorflow.replica_check import watch_model
    watch_model(opt, model)
    step = explicit_step(model, opt, x, y, True)
    capfd.readouterr()
    for _ in range(6):  # checks at steps 2, 4 and 6; each rank's rows move its own statistics
        step()
    lines = report_lines(capfd)
    result = hvd.check_replicas(model, opt)
    assert result.agree
    if n == 1:
        assert lines == [] and result.meant_to_differ == ()
        return
    assert sorted(result.meant_to_differ) == ["net/bn/moving_mean",
                                              "net/bn/moving_variance"]
    assert len(lines) == 3 and lines[0].startswith(f"{PREFIX}, step 2: 2 non-trainable")
    assert "information, not an error" in lines[0]
    assert lines[1].startswith(f"{PREFIX}, step 2: net/bn/moving_mean: rank 0 alone")


def test_check_changes_nothing_and_zero_adds_nothing(world, monkeypatch):
    r, _ = world
    results = {}
    for every in ("1", "0"):
        monkeypatch.setenv("HPCREP_CHECK_REPLICAS", every)
        model, x, y = model_and_data(r)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
        opt.build(model.trainable_variables)
        step = explicit_step(model, opt, x, y, True)
        for _ in range(3):
            step()
        ops = {op.type for op in step.get_concrete_function().graph.get_operations()}
        results[every] = (model.get_weights(), ops)
    for a, b in zip(results["1"][0], results["0"][0]):
        assert a.tobytes() == b.tobytes()
    assert "If" in results["1"][1] or "StatelessIf" in results["1"][1]
    graph_off = results["0"][1]
    assert not {"Bitcast", "If", "StatelessIf"} & graph_off, graph_off


@pytest.mark.parametrize("order", ["lso_outside", "dist_outside"])
def test_under_a_loss_scale_optimizer_the_check_runs_once_per_step(world, canary, capfd, order):
    """Under mixed precision the canary runs at the outermost optimizer whichever way the
    LossScaleOptimizer wraps: one report per check (not one per nested apply, not one inside
    the loss-scale check's branch), and the loss-scale state counts as optimizer state."""
    r, n = world
    canary("warn")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, x, y = model_and_data(r)
        sgd = keras.optimizers.SGD(0.01)
        opt = (keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(sgd))
               if order == "lso_outside" else
               hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd)))
        opt.build(model.trainable_variables)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                out = tf.cast(model(x, training=True), tf.float32)
                loss = opt.scale_loss(tf.reduce_mean((out - y) ** 2))
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        capfd.readouterr()
        for i in range(1, STEPS + 1):
            step()
            if i == PLANT_AT:
                plant(model, r, n)
        lines = report_lines(capfd)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if n == 1:
        assert lines == []
        return
    # One report, from the check after the 6th apply; the step it names is the optimizer's
    # iterations, which do not count the steps the loss scale skipped.
    assert len(lines) == 1, lines
    assert re.match(rf"{PREFIX}, step [1-6]: 1 of 4 trainable variables differ", lines[0]), lines
    assert f"net/first/kernel: {agreeing(n)}, rank {n - 1} differs" in lines[0], lines
