"""Replicator: every replica-context primitive's value, scope, input_fn, reduce, wrap_optimizer,
cross-replica batch norm, and the asynchronous regime, eagerly and inside tf.function."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.comm.groups import assignment as group_assignment
from hpcrep.errors import ReplicaContextError, ReplicatorError
from hpcrep.replicator import (CrossReplicaBatchNormalization, InputContext, PerReplica,
                               Replicator, SyncGroups, get_replica_context)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def rep():
    hvd.init()
    replicator = Replicator()
    yield replicator
    replicator.close()


def no_autotune(dataset):
    """``dataset`` without tf.data's autotuning thread. Deleting an iterator whose autotuning
    thread was started from inside a tf.function waited for that thread's next wake-up (TF
    2.21): 9 s at the Replicator's close when this file runs alone, 18-40 s in the full suite.
    What these tests check does not depend on it."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def maybe_compile(fn, compiled):
    return tf.function(fn) if compiled else fn


@pytest.mark.parametrize("compiled", [False, True])
def test_primitive_values(world, rep, compiled):
    r, n = world

    def step_fn():
        ctx = get_replica_context()
        x = tf.fill([3], float(ctx.replica_id + 1))
        rows = tf.fill([ctx.replica_id + 1, 2], float(ctx.replica_id))
        return {
            "id": tf.constant(ctx.replica_id), "n": tf.constant(ctx.num_replicas),
            "sum": ctx.all_reduce("sum", x), "mean": ctx.all_reduce("mean", x),
            "min": ctx.all_reduce("min", x), "max": ctx.all_reduce(tf.distribute.ReduceOp.SUM, x),
            "true_max": ctx.all_reduce("max", x),
            "nest": ctx.all_reduce("sum", (x, {"i": tf.constant([ctx.replica_id])})),
            "gather": ctx.all_gather(rows), "gather1": ctx.all_gather(tf.reshape(rows, [2, -1]),
                                                                     axis=1),
            "bcast": ctx.broadcast(x * 10.0, source_replica=ctx.num_replicas - 1),
        }

    out = maybe_compile(lambda: rep.run(step_fn), compiled)()
    assert isinstance(out, PerReplica) and len(out.values) == 1
    v = {k: tf.nest.map_structure(np.asarray, val) for k, val in out.values[0].items()}
    total = n * (n + 1) / 2
    assert int(v["id"]) == r and int(v["n"]) == n
    np.testing.assert_allclose(v["sum"], np.full(3, total))
    np.testing.assert_allclose(v["mean"], np.full(3, total / n))
    np.testing.assert_allclose(v["min"], np.ones(3))
    np.testing.assert_allclose(v["max"], np.full(3, total))
    np.testing.assert_allclose(v["true_max"], np.full(3, float(n)))
    np.testing.assert_allclose(v["nest"][0], np.full(3, total))
    assert int(v["nest"][1]["i"][0]) == n * (n - 1) // 2
    expected = np.concatenate([np.full((k + 1, 2), float(k)) for k in range(n)])
    np.testing.assert_array_equal(v["gather"], expected)
    expected1 = np.concatenate([np.full((2, k + 1), float(k)) for k in range(n)], axis=1)
    np.testing.assert_array_equal(v["gather1"], expected1)
    np.testing.assert_allclose(v["bcast"], np.full(3, 10.0 * n))


def test_all_reduce_is_differentiable(world, rep):
    r, n = world
    w = tf.Variable(2.0)

    def step_fn():
        ctx = get_replica_context()
        with tf.GradientTape() as tape:
            y = ctx.all_reduce("sum", w * float(ctx.replica_id + 1))
        return tape.gradient(y, w)

    grad = rep.run(step_fn).values[0]
    # d/dw of sum_k w*(k+1) flows back to each replica as the summed upstream gradient (n)
    # times its own factor (r + 1).
    np.testing.assert_allclose(float(grad), n * (r + 1))


def test_primitives_outside_step_fn_raise(rep):
    with pytest.raises(ReplicaContextError, match="outside a step function"):
        get_replica_context()
    kept = rep.run(lambda: get_replica_context()).values[0]
    with pytest.raises(ReplicaContextError, match="all_reduce was used outside"):
        kept.all_reduce("sum", tf.ones([1]))
    with pytest.raises(ReplicaContextError):
        kept.replica_id  # noqa: B018 - the property access itself must raise
    layer = CrossReplicaBatchNormalization()
    with pytest.raises(ReplicaContextError):
        layer(tf.ones([4, 3]), training=True)
    with pytest.raises(ReplicatorError, match="unsupported reduction"):
        rep.run(lambda: get_replica_context().all_reduce("product", tf.ones([1])))


def test_scope_makes_variables_equal(world, rep):
    r, _ = world
    keras.utils.set_random_seed(1000 + r)  # different initial values on every rank
    with rep.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        extra = tf.Variable(float(r))
    assert float(extra.numpy()) == 0.0
    gathered = hvd.allgather_object([w for w in model.get_weights()])
    for other in gathered[1:]:
        for a, b in zip(gathered[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("compiled", [False, True])
def test_input_fn_context_and_per_replica_data(world, rep, compiled):
    r, n = world
    seen = []

    def input_fn(ctx):
        seen.append((ctx.replica_id, ctx.num_replicas))
        return no_autotune(ctx.shard(tf.data.Dataset.range(100)).batch(2))

    def step_fn(batch):
        return get_replica_context().all_gather(batch)

    run = maybe_compile(lambda: rep.run(step_fn, input_fn), compiled)
    first, second = run().values[0].numpy(), run().values[0].numpy()
    assert seen == [(r, n)]  # built once, with this replica's context
    np.testing.assert_array_equal(np.sort(first), np.arange(2 * n))
    np.testing.assert_array_equal(np.sort(second), np.arange(2 * n, 4 * n))
    iterator = rep.distribute_dataset(input_fn)
    element = next(iterator)
    assert isinstance(element, PerReplica)
    got = rep.run(step_fn, args=(element,)).values[0].numpy()
    np.testing.assert_array_equal(np.sort(got), np.arange(2 * n))


@pytest.mark.parametrize("compiled", [False, True])
def test_reduce(world, rep, compiled):
    r, n = world

    def reduce_all():
        per = rep.run(lambda: tf.fill([r + 1], float(r + 1)))
        fixed = rep.run(lambda: tf.constant([float(r), 1.0]))
        return (rep.reduce("sum", fixed), rep.reduce("mean", fixed), rep.reduce("min", fixed),
                rep.reduce("max", fixed), rep.reduce("sum", per, axis=0),
                rep.reduce("mean", per, axis=0), rep.reduce("max", {"a": fixed.values[0]}))

    s, m, lo, hi, s_axis, m_axis, nest = maybe_compile(reduce_all, compiled)()
    np.testing.assert_allclose(s, [n * (n - 1) / 2, n])
    np.testing.assert_allclose(m, [(n - 1) / 2, 1.0])
    np.testing.assert_allclose(lo, [0.0, 1.0])
    np.testing.assert_allclose(hi, [n - 1.0, 1.0])
    squares = sum((k + 1) ** 2 for k in range(n))
    np.testing.assert_allclose(float(s_axis), squares)
    np.testing.assert_allclose(float(m_axis), squares / (n * (n + 1) / 2))
    np.testing.assert_allclose(nest["a"], [n - 1.0, 1.0])


B, FEATURES, STEPS = 8, 5, 6


def global_data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(STEPS * n * B, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype("float32")
    return x, y


def make_model(batch_norm=None):
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh")]
    if batch_norm is not None:
        layers.append(batch_norm())
    return keras.Sequential(layers + [keras.layers.Dense(1)])


def reference(x, y, n, batch_norm=None):
    """One process training on the concatenated batches of all replicas."""
    keras.utils.set_random_seed(7)
    model = make_model(batch_norm)
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    for step in range(STEPS):
        rows = slice(step * n * B, (step + 1) * n * B)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[rows], training=True) - y[rows]))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return model


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bn", [None, "cross_replica"])
def test_training_matches_single_process(world, rep, compiled, bn):
    r, n = world
    x, y = global_data(n)
    batch_norm = None if bn is None else CrossReplicaBatchNormalization
    keras.utils.set_random_seed(7 if r == 0 else 99 + r)  # rank 0's weights win in scope()
    with rep.scope():
        model = make_model(batch_norm)
        opt = rep.wrap_optimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    opt.build(model.trainable_variables)

    def input_fn(ctx):
        # Step s of replica k: rows [s*n*B + k*B, s*n*B + (k+1)*B): the reference's batch split.
        xs = x.reshape(STEPS, ctx.num_replicas, B, FEATURES)[:, ctx.replica_id]
        ys = y.reshape(STEPS, ctx.num_replicas, B, 1)[:, ctx.replica_id]
        return no_autotune(tf.data.Dataset.from_tensor_slices((xs, ys)))

    def step_fn(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    train = maybe_compile(lambda: rep.reduce("mean", rep.run(step_fn, input_fn)), compiled)
    losses = [float(train()) for _ in range(STEPS)]
    assert losses[-1] < losses[0]
    ref = reference(x, y, n, batch_norm=None if bn is None else keras.layers.BatchNormalization)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_cross_replica_batch_norm_uses_global_moments(world, rep):
    r, n = world
    rng = np.random.default_rng(3)
    everyone = rng.normal(loc=2.0, scale=3.0, size=(n, 4 + 0, 3)).astype("float32")
    with rep.scope():
        layer = CrossReplicaBatchNormalization(momentum=0.0, epsilon=1e-3)
        layer.build((None, 3))
    out = rep.run(lambda: layer(everyone[r], training=True)).values[0].numpy()
    flat = everyone.reshape(-1, 3)
    mean, var = flat.mean(0), flat.var(0)
    np.testing.assert_allclose(out, (everyone[r] - mean) / np.sqrt(var + 1e-3), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-5)


def test_async_groups_within_test_world(world, param_store):
    """Sync groups: primitives span the group; after join() every rank holds the store's value,
    which is the initial value plus every delta the groups pushed (on both stores)."""
    r, n = world
    groups = 2 if n >= 2 else 1
    x, y = global_data(n, seed=5)
    with Replicator(SyncGroups(num_groups=groups, exchange_every=2)) as arep:
        assert (hvd.rank(), hvd.size()) == (r, n)  # a group never changes the job's ranks
        keras.utils.set_random_seed(11 + r)
        with arep.scope():
            w = tf.Variable(tf.random.normal([FEATURES, 1]))
        opt = arep.wrap_optimizer(keras.optimizers.SGD(0.05))
        opt.build([w])

        def input_fn(ctx):
            assert (ctx.replica_id, ctx.num_replicas) == (r, n)
            return ctx.shard(tf.data.Dataset.from_tensor_slices((x, y))).batch(4).repeat()

        def step_fn(batch):
            ctx = get_replica_context()
            xb, yb = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(xb @ w - yb))
            opt.apply(tape.gradient(loss, [w]), [w])
            # hvd.* collectives called by step_fn span the group too; hvd.size() is the job's.
            return ctx.all_reduce("sum", tf.ones([1])), loss, hvd.allreduce(
                tf.constant([1.0]), op=hvd.Sum), tf.constant(hvd.size())

        train = tf.function(lambda: arep.run(step_fn, input_fn))
        first = None
        for _ in range(30):
            ones, loss, hvd_ones, job_size = train().values[0]
            first = float(loss) if first is None else first
        assert float(ones[0]) == float(hvd_ones[0]) == arep.num_replicas_in_sync
        assert int(job_size) == n
        assert hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy()[0] == n  # outside run()
        in_group = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, process_set=arep.communicator)
        assert in_group.numpy()[0] == arep.num_replicas_in_sync  # the group, when asked for
        steps = arep.join()
        assert list(steps) == [30] * groups
        assert arep.group_stats()["param_store"] == param_store
        ledger = arep.store_ledger()
        pushed = hvd.allreduce(tf.constant(ledger["pushed"]), op=hvd.Sum).numpy()
        np.testing.assert_allclose(ledger["store"], ledger["initial"] + pushed, rtol=1e-12,
                                   atol=1e-12)
        assert np.abs(pushed).max() > 1e-3  # the groups did move the store
        np.testing.assert_array_equal(w.numpy().reshape(-1),
                                      ledger["store"].astype(np.float32))
    assert hvd.size() == n
    final = hvd.allgather_object(w.numpy())
    for other in final[1:]:
        np.testing.assert_array_equal(final[0], other)
    full_loss = float(np.mean(np.square(x @ w.numpy() - y)))
    assert full_loss < first


@pytest.mark.parametrize("compiled", [False, True])
def test_async_group_primitives_span_the_group_with_job_ranks(world, compiled, param_store):
    """In a sync group every primitive, reduce() and hvd.* collective called by step_fn see only
    the group (the communicator is bound when the step is traced), while hvd.rank() stays the
    job rank."""
    r, n = world
    num_groups = 2 if n >= 2 else 1
    assigned = group_assignment(n, num_groups)
    members = [k for k in range(n) if assigned[k] == assigned[r]]
    with Replicator(SyncGroups(num_groups=num_groups)) as arep:
        with arep.scope():
            tf.Variable(1.0)

        def step_fn():
            ctx = get_replica_context()
            me = hvd.rank()
            return {"id": tf.constant(ctx.replica_id), "n": tf.constant(ctx.num_replicas),
                    "rank": tf.constant(me),
                    "gather": ctx.all_gather(tf.fill([me + 1, 2], float(me))),
                    "bcast": ctx.broadcast(tf.fill([3], float(me)), ctx.num_replicas - 1),
                    "sum": ctx.all_reduce("sum", tf.constant([float(me)])),
                    "hvd_gather": hvd.allgather(tf.constant([me]))}

        out = maybe_compile(lambda: arep.run(step_fn), compiled)()
        v = {k: t.numpy() for k, t in out.values[0].items()}
        total = arep.reduce("sum", PerReplica((tf.constant(1.0),)))
        arep.join()
        assert arep.group_stats()["param_store"] == param_store
    assert (int(v["id"]), int(v["n"]), int(v["rank"])) == (members.index(r), len(members), r)
    np.testing.assert_array_equal(v["gather"], np.concatenate(
        [np.full((k + 1, 2), float(k)) for k in members]))
    np.testing.assert_array_equal(v["bcast"], np.full(3, float(members[-1])))
    np.testing.assert_array_equal(v["sum"], [float(sum(members))])
    np.testing.assert_array_equal(v["hvd_gather"], members)
    assert float(total) == len(members)


def test_reducing_one_tensor_twice_in_a_tf_function(world):
    """Regression: Grappler merges identical concats and folds constant ones; reductions done in
    place on such shared buffers leaked into each other and into later calls."""
    _, n = world
    v = tf.Variable(1.0)

    @tf.function
    def twice():
        x, c = tf.ones([3]) * v, tf.ones([3])
        return [hvd.allreduce(t, op=hvd.Sum) for t in (x, x, c, c)]

    for _ in range(3):
        for out in twice():
            np.testing.assert_array_equal(out.numpy(), np.full(3, float(n)))


def test_input_fn_data_is_not_resharded_by_transparent_mode(world, rep):
    """`hpcrep run` runs scripts in transparent mode, which shards Python loops over datasets;
    input_fn has already chosen this replica's share and must get all of it."""
    from hpcrep.tensorflow import transparent

    r, n = world

    def input_fn(ctx):
        return ctx.shard(tf.data.Dataset.range(1000)).repeat().batch(3)

    def own_input_fn(ctx):  # this replica's data chosen without ctx.shard
        start = 1000 * ctx.replica_id
        return tf.data.Dataset.range(start, start + 1000).batch(3)

    with transparent(announce=False):
        batch = rep.run(lambda b: b, input_fn).values[0].numpy()
        own = rep.run(lambda b: b, own_input_fn).values[0].numpy()
        looped = [int(v) for v in InputContext(r, n).shard(tf.data.Dataset.range(4 * n))]
    np.testing.assert_array_equal(batch, [r, r + n, r + 2 * n])
    np.testing.assert_array_equal(own, [1000 * r, 1000 * r + 1, 1000 * r + 2])
    assert looped == [r, r + n, r + 2 * n, r + 3 * n]  # a Python loop over ctx.shard's share
