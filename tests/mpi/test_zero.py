"""ZeRO stage 1 (``shard_optimizer_state=True``): the sharded optimizer follows the unsharded one
step for step, every rank holds bitwise the same weights after every step, each rank holds about
1/size of the slots, checkpoints hold the full state, and what cannot be sharded is refused.

At one rank the sharded optimizer is the plain one: the tests still run (and compare equal
trivially); the refusals are checked at every size.
"""

from __future__ import annotations

import hashlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import CheckpointManager
from hpcrep.errors import ShardedStateError
from hpcrep.tensorflow import zero
from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state
from hpcrep.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback

B = 8
STEPS = 5


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    # 5*8 + 8 + 8*3 + 3 = 75 elements: at 2 and 4 ranks the last slice is padded.
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def data(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.normal(size=(B, 5)).astype("float32")
    return x, np.stack([x.sum(1), x[:, 0] * x[:, 1], np.sin(x[:, 2])], 1).astype("float32")


def digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def assert_ranks_bitwise_equal(variables, what: str) -> None:
    digests = hc.allgather_object(digest([np.asarray(v) for v in variables]))
    assert len(set(digests)) == 1, f"{what} differ across ranks: {digests}"


def train(make_optimizer, shard: bool, steps: int = STEPS, check_each_step: bool = True):
    """Train a fresh model with a custom tf.function loop; return (model, optimizer)."""
    model = make_model(7)
    opt = hvd.DistributedOptimizer(make_optimizer(), shard_optimizer_state=shard)
    opt.build(model.trainable_variables)

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    for s in range(steps):
        step(*data(hc.rank(), s))
        if check_each_step:
            assert_ranks_bitwise_equal([v.numpy() for v in model.trainable_variables],
                                       f"weights after step {s + 1}")
    return model, opt


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw_excluding_biases": lambda: _adamw_without_bias_decay(),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
}


def _adamw_without_bias_decay() -> keras.optimizers.AdamW:
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sharded_equals_unsharded_and_ranks_agree(name):
    plain_model, plain_opt = train(OPTIMIZERS[name], shard=False, check_each_step=False)
    model, opt = train(OPTIMIZERS[name], shard=True)
    assert zero.is_sharded(opt) == (hc.size() > 1)
    if name == "adamw_excluding_biases":  # decayed with the mask, as Keras decays per variable
        decayed = [opt._use_weight_decay(v) for v in model.trainable_variables]
        assert decayed == [True, False, True, False]
        if zero.is_sharded(opt):
            assert opt._hpcrep_zero.decay_mask == decayed
    for a, b in zip(model.trainable_variables, plain_model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6, err_msg=a.path)
    assert int(opt.iterations.numpy()) == int(plain_opt.iterations.numpy()) == STEPS
    # The gathered state is the unsharded optimizer's, in its layout.
    full, plain = zero.state_arrays(opt), zero.state_arrays(plain_opt)
    assert [a.shape for a in full] == [a.shape for a in plain]
    for a, b in zip(full, plain):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    assert_ranks_bitwise_equal(full, "gathered optimizer state")


@pytest.mark.timeout(120)
def test_fit_matches_unsharded():
    def fitted(shard: bool) -> keras.Model:
        model = make_model(3)
        model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                               shard_optimizer_state=shard), "mse",
                      jit_compile=False)
        xs, ys = zip(*(data(hc.rank(), s) for s in range(4)))
        model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=2,
                  shuffle=False, verbose=0, callbacks=[BroadcastGlobalVariablesCallback(0)])
        return model

    plain, sharded = fitted(False), fitted(True)
    assert_ranks_bitwise_equal([v.numpy() for v in sharded.trainable_variables],
                               "weights after fit")
    assert int(sharded.optimizer.iterations.numpy()) == 8
    for a, b in zip(sharded.trainable_variables, plain.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6, err_msg=a.path)


LEARNING_RATES = {
    "float": lambda: 0.01,
    "schedule": lambda: keras.optimizers.schedules.ExponentialDecay(0.01, 2, 0.9),
}


def train_unbuilt(learning_rate, shard: bool, via: str) -> tuple[keras.Model, list[float]]:
    """The usual custom loop: an unbuilt optimizer, first applied inside the tf.function (which
    builds it while tracing). Each rank fits its own fixed batch; returns the model and the
    loss of every step, averaged over the ranks."""
    model = make_model(11)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(learning_rate()),
                                   shard_optimizer_state=shard)
    assert not opt.built

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        if via == "apply":
            opt.apply(grads, model.trainable_variables)
        else:
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x, y = data(hc.rank(), 0)
    losses = [float(hc.allreduce(np.array([step(x, y).numpy()]), op=hc.ReduceOp.Average)[0])
              for _ in range(STEPS)]
    assert int(opt.iterations.numpy()) == STEPS
    assert zero.is_sharded(opt) == (shard and hc.size() > 1)
    return model, losses


@pytest.mark.timeout(180)
@pytest.mark.parametrize("via", ["apply", "apply_gradients"])
@pytest.mark.parametrize("lr", sorted(LEARNING_RATES))
def test_first_apply_inside_tf_function(lr, via):
    """Building the sharded state while the step is traced reads the optimizer's config (the
    learning rate's value) eagerly; the run then follows the unsharded one."""
    model, losses = train_unbuilt(LEARNING_RATES[lr], shard=True, via=via)
    plain_model, plain_losses = train_unbuilt(LEARNING_RATES[lr], shard=False, via=via)
    assert all(b < a for a, b in zip(losses, losses[1:])), f"losses do not fall: {losses}"
    np.testing.assert_allclose(losses, plain_losses, rtol=2e-5)
    weights = [v.numpy() for v in model.trainable_variables]
    assert_ranks_bitwise_equal(weights, "weights")
    for a, b in zip(weights, plain_model.trainable_variables):
        np.testing.assert_allclose(a, b.numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.timeout(60)
def test_slot_bytes_are_one_over_size():
    model = make_model(1)
    plain = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    sharded = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True)
    plain.build(model.trainable_variables)
    sharded.build(model.trainable_variables)
    full, mine = zero.state_bytes(plain), zero.state_bytes(sharded)
    total = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert full == {"params": 4 * total, "slots": 2 * 4 * total, "shard": 0}
    n = hc.size()
    assert mine["params"] == 4 * total
    if n == 1:
        assert mine == full
    else:
        per_rank = -(-total // n)  # ceil: the last slices are padded
        assert mine["slots"] == 2 * 4 * per_rank
        assert mine["shard"] == 4 * per_rank
        assert mine["slots"] * n < full["slots"] + 2 * 4 * n


@pytest.mark.timeout(120)
def test_checkpoint_holds_full_state_and_restores_either_way(shared_dir):
    """A checkpoint written by the sharded optimizer is what the unsharded one writes; each
    restores the other's and continues along the same trajectory."""
    make = OPTIMIZERS["adam"]
    model, opt = train(make, shard=True, steps=3)
    plain_model, plain_opt = train(make, shard=False, steps=3, check_each_step=False)
    manager = CheckpointManager(shared_dir, keep=2)
    manager.save(training_state(model, opt), step=3)
    ckpt = manager.restore()
    for a, b in zip(ckpt.list("optimizer"), zero.state_arrays(plain_opt)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)

    def continued(shard: bool) -> list[np.ndarray]:
        m = make_model(99)  # other starting weights: the checkpoint must overwrite them all
        o = hvd.DistributedOptimizer(make(), shard_optimizer_state=shard)
        o.build(m.trainable_variables)
        load_training_state(ckpt, m, o)
        restored = zero.state_arrays(o)
        for a, b in zip(restored, ckpt.list("optimizer")):
            np.testing.assert_array_equal(a, b)  # restored bit for bit, sharded or not
        for s in range(3, 6):
            x, y = data(hc.rank(), s)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(x) - y))
            o.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)
        return [v.numpy() for v in m.trainable_variables]

    sharded_after, plain_after = continued(True), continued(False)
    assert_ranks_bitwise_equal(sharded_after, "weights after restoring")
    for a, b in zip(sharded_after, plain_after):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


BAD = {
    "clipnorm": (lambda: keras.optimizers.Adam(clipnorm=1.0), {}, "clipnorm"),
    "use_ema": (lambda: keras.optimizers.Adam(use_ema=True), {}, "use_ema"),
    "accumulation": (lambda: keras.optimizers.SGD(gradient_accumulation_steps=2), {},
                     "gradient_accumulation_steps"),
    "lamb": (lambda: keras.optimizers.Lamb(), {}, "Lamb"),
    "adafactor": (lambda: keras.optimizers.Adafactor(), {}, "Adafactor"),
    "loss_scale": (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), {},
                   "LossScaleOptimizer"),
    "adasum": (lambda: keras.optimizers.SGD(), {"op": hvd.Adasum}, "Adasum"),
    "passes": (lambda: keras.optimizers.SGD(), {"backward_passes_per_step": 2},
               "backward_passes_per_step"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_options_raise_on_every_rank(case):
    make, options, named = BAD[case]
    with pytest.raises(ShardedStateError, match=named):
        hvd.DistributedOptimizer(make(), shard_optimizer_state=True, **options)


@pytest.mark.timeout(60)
def test_missing_gradient_raises_on_every_rank():
    if hc.size() == 1:
        pytest.skip("one rank: the sharded optimizer is the plain one, which skips the variable")
    model = make_model(1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True)
    opt.build(model.trainable_variables)
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    grads[1] = None
    with pytest.raises(ShardedStateError, match="no gradient"):
        opt.apply(grads, model.trainable_variables)


@pytest.mark.timeout(180)
def test_transparent_mode_shards_keras_optimizers(monkeypatch):
    """``HPCREP_SHARD_OPTIMIZER_STATE=1``: an unchanged script's Adam shards its state (the same
    object, built by ``fit``) and trains as the unsharded transparent run does."""
    from hpcrep.tensorflow import transparent

    xs, ys = zip(*(data(0, s) for s in range(4 * hc.size())))  # the same rows on every rank
    x, y = np.concatenate(xs), np.concatenate(ys)

    def fitted(shard: bool):
        monkeypatch.setenv("HPCREP_SHARD_OPTIMIZER_STATE", "1" if shard else "0")
        with transparent(announce=False):
            model = make_model(3)
            opt = keras.optimizers.Adam(0.01)
            model.compile(opt, "mse")
            model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
            assert model.optimizer is opt
            state = zero.state_arrays(opt)
            return zero.is_sharded(opt), [v.numpy() for v in model.trainable_variables], state

    plain_sharded, plain, plain_state = fitted(False)
    sharded, weights, state = fitted(True)
    assert not plain_sharded and sharded == (hc.size() > 1)
    assert_ranks_bitwise_equal(weights + state, "weights and optimizer state")
    for a, b in zip(weights + state, plain + plain_state):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


@pytest.mark.timeout(180)
def test_mixed_precision_loss_scale_around_sharded():
    """``compile`` under ``mixed_float16`` wraps the sharded optimizer in a LossScaleOptimizer:
    the gradients are averaged before its check, and the sharded one updates its slice."""
    def fitted(shard: bool):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = make_model(4)
            model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                   shard_optimizer_state=shard), "mse",
                          jit_compile=False)
            xs, ys = zip(*(data(hc.rank(), s) for s in range(3)))
            model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=1,
                      shuffle=False, verbose=0, callbacks=[BroadcastGlobalVariablesCallback(0)])
        finally:
            keras.mixed_precision.set_global_policy("float32")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        return model, [v.numpy() for v in model.trainable_variables]

    model, weights = fitted(True)
    plain_model, plain = fitted(False)
    assert zero.is_sharded(model.optimizer) == (hc.size() > 1)
    applied = int(model.optimizer.inner_optimizer.iterations.numpy())  # overflows: skipped
    assert applied == int(plain_model.optimizer.inner_optimizer.iterations.numpy()) >= 1
    assert_ranks_bitwise_equal(weights, "weights")
    for a, b in zip(weights, plain):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def compiled(seed: int) -> keras.Model:
    model = make_model(seed)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                           shard_optimizer_state=True), "mse", jit_compile=False)
    return model


@pytest.mark.timeout(180)
def test_keras_backup_and_restore_keeps_the_sharded_state(shared_dir):
    """hpcrep's BackupAndRestore gathers the slots before rank 0 writes the backup, and a fresh
    run gets every rank's share of them back."""
    import hpcrep.tensorflow.keras as hvdk

    xs, ys = zip(*(data(hc.rank(), s) for s in range(3)))
    x, y = np.concatenate(xs), np.concatenate(ys)
    first = compiled(5)
    first.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0),
                         hvdk.callbacks.BackupAndRestore(shared_dir, delete_checkpoint=False)])
    ended = [v.numpy() for v in first.variables] + zero.state_arrays(first.optimizer)
    resumed = compiled(60)  # other weights: the backup must overwrite them all
    resumed.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0,
                callbacks=[hvdk.callbacks.BackupAndRestore(shared_dir)])  # nothing left to run
    started = [v.numpy() for v in resumed.variables] + zero.state_arrays(resumed.optimizer)
    assert len(started) == len(ended) == 4 + 2 + 2 * 4
    for a, b in zip(started, ended):
        np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(120)
def test_keras_save_weights_needs_consolidate_then_loads_on_every_rank(shared_dir):
    model = compiled(6)
    xs, ys = zip(*(data(hc.rank(), s) for s in range(2)))
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=B, epochs=1, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0)])
    path = f"{shared_dir}/w.weights.h5"
    if hc.size() > 1:
        with pytest.raises(ShardedStateError, match="consolidate"):
            model.save_weights(f"{shared_dir}/refused.{hc.rank()}.weights.h5")
    zero.consolidate(model.optimizer)  # collective: then rank 0 alone may save
    if hc.rank() == 0:
        model.save_weights(path)
    hc.barrier()
    loaded = compiled(61)
    loaded.optimizer.build(loaded.trainable_variables)
    loaded.load_weights(path)  # every rank reads the file and keeps its share
    for a, b in zip(zero.state_arrays(loaded.optimizer), zero.state_arrays(model.optimizer)):
        np.testing.assert_array_equal(a, b)
