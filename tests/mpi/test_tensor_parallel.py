"""Replicas of several ranks and tensor-parallel layers: the mesh's layout, a sharded model's
forward pass and gradients against the same model unsharded (which every rank builds itself from
the same seeds), training step for step against the unsharded model on the global batch, bitwise
agreement within shard groups, and checkpoints that resume at another number of shards.

At 4 ranks the replicas are 2 x 2 (and 4 x 1, 1 x 4); at 2 ranks 1 x 2 and 2 x 1; at 1 rank the
layers are plain ones and the tests check the same equalities without communication."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.checkpoint import CheckpointManager
from hpcrep.errors import CollectiveMismatchError, ReplicatorError
from hpcrep.replicator import (ColumnParallelDense, Replicator, RowBlockInitializer,
                               RowParallelDense, ShardedEmbedding, SyncGroups,
                               broadcast_from_first_replica, get_replica_context, split_mesh)
from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state
from hpcrep.tensorflow.sharded_variables import full_value, shard_spec, slice_of, specs_of

pytestmark = pytest.mark.timeout(240)

VOCAB, DIM, IDS, B, STEPS, LR = 10, 3, 4, 6, 4, 0.05  # 10 rows: uneven over 4 (3, 3, 2, 2)


@pytest.fixture(scope="module", autouse=True)
def _init():
    hvd.init()


def shard_counts():
    """Ranks per replica to try at this world size: 1, 2 and 4 where they divide it."""
    n = hc.size()
    return [k for k in (1, 2, 4) if n % k == 0]


def build(sharded, seed, mesh=None):
    """Embedding -> column(8, tanh) -> row(4, tanh) -> column(4, gathered) -> Dense(1); the
    unsharded twin uses Keras's own layers. Same seed, same initial weights. ``mesh``: the
    explicit API's (default: the enclosing Replicator.scope()'s)."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((IDS,), dtype="int32")
    emb = (ShardedEmbedding(VOCAB, DIM, mesh=mesh) if sharded
           else keras.layers.Embedding(VOCAB, DIM))
    h = keras.layers.Flatten()(emb(ids))
    h = (ColumnParallelDense(8, activation="tanh", mesh=mesh) if sharded
         else keras.layers.Dense(8, activation="tanh"))(h)
    h = (RowParallelDense(4, activation="tanh", mesh=mesh) if sharded
         else keras.layers.Dense(4, activation="tanh"))(h)
    h = (ColumnParallelDense(4, activation="tanh", gather_output=True, mesh=mesh) if sharded
         else keras.layers.Dense(4, activation="tanh"))(h)
    return keras.Model(ids, keras.layers.Dense(1)(h))


def train_reference(ids, y, steps, seed, momentum):
    """The unsharded model trained on the global batches (every replica's rows) in one
    process; returns it and its losses."""
    reference = build(False, seed=seed)
    optimizer = keras.optimizers.SGD(LR, momentum=momentum)
    losses = []
    for s in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_of(reference, ids[s].reshape(-1, IDS), y[s].reshape(-1, 1))
        optimizer.apply(tape.gradient(loss, reference.trainable_variables),
                        reference.trainable_variables)
        losses.append(float(loss))
    return reference, losses


def data(num_replicas, seed=0):
    """STEPS global batches, ids [STEPS, replicas, B, IDS] and targets [STEPS, replicas, B, 1]:
    one batch seen every step (so that 4 steps lower its loss), each replica its own rows; a
    target is the sum of a hidden score per id."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=VOCAB).astype("float32")
    ids = np.repeat(rng.integers(0, VOCAB, size=(1, num_replicas, B, IDS)), STEPS, axis=0)
    return ids.astype("int32"), (0.5 * score[ids].sum(-1, keepdims=True)).astype("float32")


def loss_of(model, ids, y):
    return tf.reduce_mean(tf.square(model(ids) - y))


def dense(g):
    return tf.convert_to_tensor(g).numpy()


@pytest.mark.parametrize("k", shard_counts())
def test_mesh_layout_and_contexts(world, k):
    r, n = world
    with Replicator(ranks_per_replica=k) as rep:
        assert (rep.num_replicas, rep.local_replica_ids, rep.shard_index) == (n // k, (r // k,),
                                                                              r % k)
        assert rep.mesh.model_parallel.ranks == tuple(range(r // k * k, r // k * k + k))
        assert rep.mesh.data_parallel.ranks == tuple(range(r % k, n, k))
        assert (hvd.rank(), hvd.size()) == (r, n)  # the job's ranks are unchanged
        seen = []

        def input_fn(ctx):
            seen.append((ctx.replica_id, ctx.num_replicas, ctx.shard_index, ctx.num_shards))
            return ctx.shard(tf.data.Dataset.range(100)).batch(3)

        def step_fn(batch):
            ctx = get_replica_context()
            assert (ctx.replica_id, ctx.num_replicas) == (r // k, n // k)
            assert (ctx.shard_index, ctx.num_shards) == (r % k, k)
            assert ctx.model_parallel is rep.mesh.model_parallel
            # Replica-level values combine over the replicas (one rank per replica counts).
            total = ctx.all_reduce("sum", tf.constant(float(ctx.replica_id)))
            # Every rank of a replica sees the same batch; replicas see different ones.
            mates = hvd.allgather(batch[None], process_set=ctx.model_parallel)
            return total, mates, ctx.all_gather(batch[None])

        total, mates, replicas = rep.run(step_fn, input_fn).values[0]
        assert seen == [(r // k, n // k, r % k, k)]
        assert float(total) == sum(range(n // k))
        np.testing.assert_array_equal(mates.numpy(), np.repeat(mates.numpy()[:1], k, axis=0))
        expected = [np.arange(100)[i::n // k][:3] for i in range(n // k)]
        np.testing.assert_array_equal(replicas.numpy(), np.stack(expected))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("k", shard_counts())
def test_forward_and_gradients_equal_unsharded(world, k, compiled):
    r, n = world
    ids, y = data(n // k)
    with Replicator(ranks_per_replica=k) as rep:
        with rep.scope():
            model = build(True, seed=5)
        reference = build(False, seed=5)
        for v, w in zip(model.weights, reference.weights):  # initialised as the unsharded one
            np.testing.assert_array_equal(v.numpy(), slice_of(w.numpy(), shard_spec(v), v.path))
        batch = (ids[0, r // k], y[0, r // k])

        def step_fn(batch):
            with tf.GradientTape() as tape:
                out = model(batch[0])
                loss = tf.reduce_mean(tf.square(out - batch[1]))
            return out, loss, tape.gradient(loss, model.trainable_variables)

        run = tf.function(rep.run) if compiled else rep.run
        out, loss, grads = run(step_fn, args=(batch,)).values[0]
        with tf.GradientTape() as tape:
            ref_loss = loss_of(reference, *batch)
        ref_grads = tape.gradient(ref_loss, reference.trainable_variables)
    np.testing.assert_allclose(out.numpy(), reference(batch[0]).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    assert len(grads) == len(ref_grads) == 9
    for v, g, g_ref in zip(model.trainable_variables, grads, ref_grads):
        np.testing.assert_allclose(dense(g), slice_of(dense(g_ref), shard_spec(v), v.path),
                                   rtol=1e-5, atol=1e-6, err_msg=v.path)


def train(rep, model, opt, ids, y, steps):
    """``steps`` compiled steps on replica ``rep``'s share of the global batches; the losses
    averaged over the replicas."""

    def step_fn(batch):
        with tf.GradientTape() as tape:
            loss = loss_of(model, *batch)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    step = tf.function(lambda b: rep.reduce("mean", rep.run(step_fn, args=(b,))))
    me = rep.local_replica_ids[0]
    return [float(step((ids[s, me], y[s, me]))) for s in range(steps)]


def whole(model, optimizer=None):
    """Every variable gathered whole (collective over each replica's ranks)."""
    state = training_state(model, optimizer)
    return state["model"] + state["optimizer"]


@pytest.mark.parametrize("k", shard_counts())
def test_training_matches_unsharded_and_shard_groups_agree(world, k):
    r, n = world
    ids, y = data(n // k, seed=1)
    with Replicator(ranks_per_replica=k) as rep:
        with rep.scope():
            model = build(True, seed=9)
            opt = rep.wrap_optimizer(keras.optimizers.SGD(LR, momentum=0.9))
        opt.build(model.trainable_variables)
        losses = train(rep, model, opt, ids, y, STEPS)
        # Within a shard group (one rank per replica) every variable is bitwise equal.
        var_specs, slot_specs = specs_of(model.weights, opt.variables)
        for v, spec in zip(model.weights + opt.variables, var_specs + slot_specs):
            mine = np.asarray(v.numpy())
            for other in hc.allgather_object(mine, rep.mesh.data_parallel):
                np.testing.assert_array_equal(other, mine, err_msg=v.path)
            if spec is None:  # whole variables: bitwise equal on every rank
                for other in hc.allgather_object(mine):
                    np.testing.assert_array_equal(other, mine, err_msg=v.path)
        trained = whole(model)

    reference, ref_losses = train_reference(ids, y, STEPS, seed=9, momentum=0.9)
    assert ref_losses[-1] < ref_losses[0]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(trained, reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_explicit_api_mesh_trains_like_unsharded(world):
    """Without a Replicator: split_mesh, layers given mesh=, broadcast_from_first_replica and
    a DistributedOptimizer over the mesh's data-parallel ranks."""
    r, n = world
    k = max(shard_counts())
    mesh = split_mesh(k)
    try:
        assert (mesh.replica_id, mesh.shard_index, mesh.num_replicas) == (r // k, r % k, n // k)
        ids, y = data(mesh.num_replicas, seed=3)
        # A replica's ranks must draw alike (each keeps a slice of the whole weight it drew);
        # other replicas draw other weights, and the broadcast gives them replica 0's.
        model = build(True, seed=4 + 100 * mesh.replica_id, mesh=mesh)
        broadcast_from_first_replica(model.weights, mesh.data_parallel)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), process_set=mesh.data_parallel)
        opt.build(model.trainable_variables)
        losses = []
        for s in range(2):
            with tf.GradientTape() as tape:
                loss = loss_of(model, ids[s, mesh.replica_id], y[s, mesh.replica_id])
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            losses.append(float(hvd.allreduce(loss, process_set=mesh.data_parallel)))
        trained = whole(model)
    finally:
        mesh.free()
    reference, ref_losses = train_reference(ids, y, 2, seed=4, momentum=0.0)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(trained, reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def resume_pairs():
    """(ranks per replica saved with, resumed with): 2 and 1 both ways, and 4 to 2."""
    ks = shard_counts()
    pairs = [(a, b) for a, b in ((2, 1), (1, 2), (4, 2)) if a in ks and b in ks]
    return pairs or [(1, 1)]


@pytest.mark.parametrize("saved_k, resumed_k", resume_pairs())
def test_checkpoint_resumes_at_another_shard_count(world, shared_dir, saved_k, resumed_k):
    r, n = world
    ids, y = data(n, seed=2)
    manager = CheckpointManager(shared_dir)
    with Replicator(ranks_per_replica=saved_k) as rep:
        with rep.scope():
            model = build(True, seed=13)
            opt = rep.wrap_optimizer(keras.optimizers.SGD(LR, momentum=0.9))
        opt.build(model.trainable_variables)
        train(rep, model, opt, ids, y, 2)
        manager.save(training_state(model, opt), step=2)
        saved = whole(model, opt)
        assert any(np.abs(v.numpy()).sum() > 0 for v in opt.variables if "momentum" in v.name)

    with Replicator(ranks_per_replica=resumed_k) as rep:
        with rep.scope():
            model = build(True, seed=14 + r)  # other weights: the restore must replace them
            opt = rep.wrap_optimizer(keras.optimizers.SGD(LR, momentum=0.9))
        opt.build(model.trainable_variables)
        ckpt = manager.restore()
        assert ckpt is not None and ckpt.step == 2
        load_training_state(ckpt, model, opt)
        assert any(shard_spec(v) is not None for v in model.weights) == (resumed_k > 1)
        restored = whole(model, opt)
    assert len(restored) == len(saved)
    for a, b in zip(restored, saved):
        np.testing.assert_array_equal(a, b)


def test_row_block_initializer_draws_only_own_rows_and_equals_plain_embedding(world):
    k = max(shard_counts())
    with Replicator(ranks_per_replica=k) as rep:
        with rep.scope():
            layer = ShardedEmbedding(VOCAB, DIM, embeddings_initializer=RowBlockInitializer(
                block_rows=4, seed=3))
            layer.build()
        table = full_value(layer.embeddings, shard_spec(layer.embeddings))
    plain = keras.layers.Embedding(VOCAB, DIM, embeddings_initializer=RowBlockInitializer(
        block_rows=4, seed=3))
    plain.build()
    np.testing.assert_array_equal(table, plain.embeddings.numpy())
    assert np.unique(table).size == VOCAB * DIM


def test_bad_ranks_per_replica_fail_on_every_rank(world):
    r, n = world
    with pytest.raises(ReplicatorError, match=f"must divide the number of ranks, but the job has "
                                              f"{n} rank"):
        Replicator(ranks_per_replica=n + 1)
    with pytest.raises(ReplicatorError, match="must be >= 1"):
        Replicator(ranks_per_replica=0)
    if n < 2:
        pytest.skip("ranks disagreeing, shards of 2 and sync groups need at least 2 ranks")
    with pytest.raises(CollectiveMismatchError):
        Replicator(ranks_per_replica=1 if r == 0 else 2)
    with pytest.raises(ReplicatorError, match="synchronous regime only"):
        Replicator(SyncGroups(num_groups=1), ranks_per_replica=2)
    with Replicator(ranks_per_replica=2) as rep, rep.scope():
        with pytest.raises(ReplicatorError, match="units=3 must be a multiple of the 2 ranks"):
            ColumnParallelDense(3)
        with pytest.raises(ReplicatorError, match="input_dim=1 rows cannot be split over 2"):
            ShardedEmbedding(1, 4)
