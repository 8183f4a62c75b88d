"""Unit checks of the reference workloads' numerical pieces (jobs/) and of the benchmark variants
swapped under their steps (bench/variants.py), in one process (no mpirun)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm


@pytest.fixture(scope="module", autouse=True)
def world():
    hpcrep.comm.init()
    yield


def test_l2_projection_preserves_mass_and_mean_and_splits_between_neighbours():
    from jobs.d4pg.learning import l2_project

    z_q = tf.linspace(0.0, 10.0, 11)
    z_p = tf.constant([[3.0, 4.5, 20.0], [-5.0, 7.25, 7.25]])
    p = tf.constant([[0.5, 0.25, 0.25], [0.2, 0.4, 0.4]])
    out = l2_project(z_p, p, z_q).numpy()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[0, 3], 0.5)            # on an atom: all its mass there
    np.testing.assert_allclose(out[0, [4, 5]], [0.125, 0.125])  # halfway: split evenly
    np.testing.assert_allclose(out[0, 10], 0.25)          # above v_max: clipped to the top atom
    np.testing.assert_allclose(out[1, 0], 0.2)            # below v_min: clipped to the bottom
    np.testing.assert_allclose(out[1, [7, 8]], [0.6, 0.2], rtol=1e-6)
    in_range_mean = 0.2 * 0.0 + 0.8 * 7.25                # the mean of the clipped source
    np.testing.assert_allclose(out[1] @ z_q.numpy(), in_range_mean, rtol=1e-6)


def test_n_step_adder_discounts_and_flushes_at_episode_end():
    from jobs.d4pg.acting import NStepAdder

    adder = NStepAdder(n=3, discount=0.5)
    out = []
    for t, r in enumerate([1.0, 2.0, 3.0, 4.0]):
        out += adder.add(t, t, r, t + 1, terminated=False, truncated=(t == 3))
    # Complete 3-step windows from t=0 and t=1, then the truncation flushes t=2 and t=3.
    assert [(o, ret, d, nxt) for o, _, ret, d, nxt in out] == [
        (0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 3), (1, 2 + 0.5 * 3 + 0.25 * 4, 0.125, 4),
        (2, 3 + 0.5 * 4, 0.25, 4), (3, 4.0, 0.5, 4)]
    adder = NStepAdder(n=3, discount=0.5)
    out = adder.add(0, 0, 1.0, 1, terminated=True, truncated=False)
    assert out == [(0, 0, 1.0, 0.0, 1)]                  # a true termination does not bootstrap


def test_spectral_norm_divides_by_the_largest_singular_value():
    from jobs.sngan.spectral_norm import SNConv2D, SNDense

    # Power iteration's error shrinks like (sigma2/sigma1)^(2k): with an unlucky random kernel
    # 30 steps missed 1e-3, so fix the seed and take 100.
    tf.keras.utils.set_random_seed(1)
    layer = SNDense(7)
    x = tf.random.normal((4, 5))
    layer(x)
    u0 = np.array(layer.u)
    np.testing.assert_array_equal(np.array(layer.u), u0)  # inference does not touch u
    for _ in range(100):
        layer(x, training=True)
    assert not np.allclose(np.array(layer.u), u0)
    w = layer.normalized_kernel(training=False).numpy()
    np.testing.assert_allclose(np.linalg.svd(w, compute_uv=False)[0], 1.0, rtol=1e-3)
    conv = SNConv2D(6, 3)
    img = tf.random.normal((2, 8, 8, 4))
    for _ in range(100):
        conv(img, training=True)
    w = conv.normalized_kernel(training=False).numpy().reshape(-1, 6)
    np.testing.assert_allclose(np.linalg.svd(w, compute_uv=False)[0], 1.0, rtol=1e-3)
    # The gradient flows through sigma: it is orthogonal-ish to the kernel direction, unlike the
    # plain gradient of a loss linear in the kernel.
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(x))
    g = tape.gradient(y, layer.kernel)
    with tf.GradientTape() as tape:
        y_plain = tf.reduce_sum(tf.matmul(x, layer.kernel))
    g_plain = tape.gradient(y_plain, layer.kernel)
    assert not np.allclose(g.numpy() * layer.sigma(), g_plain.numpy(), atol=1e-4)


def test_conditional_batch_norm_uses_per_class_gain_and_bias():
    from hpcrep.replicator import Replicator
    from jobs.sngan.model import ConditionalBatchNorm

    rep = Replicator()
    cbn = ConditionalBatchNorm(classes=3, sync=True)
    x = tf.random.normal((6, 4, 4, 2))
    labels = tf.constant([0, 1, 2, 0, 1, 2])
    train = lambda: rep.local_results(rep.run(lambda: cbn(x, labels, training=True)))[0]  # noqa: E731
    out = train().numpy()
    np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    cbn.gamma.assign(tf.constant([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]))
    cbn.beta.assign(tf.constant([[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]]))
    out2 = train().numpy()
    np.testing.assert_allclose(out2[1], 2 * out[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out2[2], out[2] + 5.0, rtol=1e-5, atol=1e-5)
    # Cross-replica statistics outside a replicated step would silently be local: refused.
    from hpcrep.errors import ReplicaContextError
    with pytest.raises(ReplicaContextError):
        cbn(x, labels, training=True)


@pytest.mark.parametrize("mode", ["hpcrep", "nosync", "mpi4py"])
def test_sngan_replicated_steps_run_and_hinge_losses(mode):
    from bench.variants import variant
    from hpcrep.replicator import Replicator
    from jobs.sngan.model import SNGAN, d_hinge_loss, g_hinge_loss

    assert float(d_hinge_loss(tf.constant([2.0, 0.0]), tf.constant([-2.0, 0.0]))) == 1.0
    assert float(g_hinge_loss(tf.constant([1.0, 3.0]))) == -2.0
    images = tf.random.uniform((4, 8, 8, 1), -1, 1)
    labels = tf.constant([0, 1, 2, 0])
    data = lambda ctx: tf.data.Dataset.from_tensors((images, labels)).repeat()  # noqa: E731
    v = variant(mode)
    gan = SNGAN(Replicator(), data, image_size=8, channels=1, classes=3, g_ch=8, d_ch=8,
                z_dim=4, batch=4, n_dis=2, sync=v.sync_batch_norm,
                wrap_optimizer=None if mode == "hpcrep" else v.DistributedOptimizer)
    weights = gan.generator.trainable_variables
    before = [w.numpy().copy() for w in weights]
    d_loss, g_loss = gan.train_step()
    assert np.isfinite(d_loss) and np.isfinite(g_loss)
    assert any(not np.allclose(b, w.numpy()) for b, w in zip(before, weights))
    assert int(gan.d_opt.iterations) == 2 and int(gan.g_opt.iterations) == 1


def test_resnet_warmup_matches_the_keras_callback_formula():
    from jobs.resnet.model import scaled_learning_rate, warmup_learning_rate

    peak = scaled_learning_rate(0.1, 512)
    assert peak == pytest.approx(0.2)
    assert warmup_learning_rate(0, 100, peak, 4) == pytest.approx(0.05)
    assert warmup_learning_rate(50, 100, peak, 4) == pytest.approx(0.05 * (0.5 * 3 + 1))
    assert warmup_learning_rate(100, 100, peak, 4) == pytest.approx(peak)


def test_resnet_schedule_warms_up_then_decays_to_zero():
    from jobs.resnet.model import scheduled_learning_rate, warmup_learning_rate

    peak = 0.2
    assert scheduled_learning_rate(50, 100, 300, peak, 4) == warmup_learning_rate(50, 100, peak, 4)
    assert scheduled_learning_rate(100, 100, 300, peak, 4) == pytest.approx(peak)
    assert scheduled_learning_rate(200, 100, 300, peak, 4) == pytest.approx(peak / 2)
    assert scheduled_learning_rate(300, 100, 300, peak, 4) == pytest.approx(0.0, abs=1e-12)
    rates = [scheduled_learning_rate(s, 100, 300, peak, 4) for s in range(100, 301)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_synchronizers_are_identity_on_one_rank_and_reject_unknown_modes():
    from bench.sync import make_synchronizer

    grads = [tf.constant([1.0, 2.0]), tf.ones((2, 2))]
    for mode in ("hpcrep", "nosync", "mpi4py"):
        out = make_synchronizer(mode)(grads)
        for a, b in zip(grads, out):
            np.testing.assert_array_equal(a.numpy(), np.asarray(b))
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([3, 2]))
    for mode in ("hpcrep", "mpi4py"):
        np.testing.assert_array_equal(np.asarray(tf.convert_to_tensor(
            make_synchronizer(mode)([sparse])[0])), [[0, 0], [1, 1], [0, 0]])
    with pytest.raises(ValueError, match="unknown synchronisation mode"):
        make_synchronizer("nccl")


def test_variants_put_their_tape_under_the_same_compiled_step():
    """Each variant's tape gives, on one rank, the plain gradients inside a compiled step, with
    None gradients and IndexedSlices handled; hpcrep's is the public class itself."""
    import hpcrep.tensorflow as hvd
    from bench.variants import variant

    assert variant("hpcrep").DistributedGradientTape is hvd.DistributedGradientTape
    assert variant("hpcrep").DistributedOptimizer is hvd.DistributedOptimizer
    assert not variant("nosync").sync_batch_norm and variant("mpi4py").sync_batch_norm
    w = tf.Variable([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    unused = tf.Variable(1.0)
    for mode in ("hpcrep", "nosync", "mpi4py"):
        wrap = variant(mode).DistributedGradientTape

        @tf.function
        def grads(wrap=wrap):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(w, [1, 1])) * 2.0
            return wrap(tape).gradient(loss, [w, unused])

        g_w, g_unused = grads()
        assert g_unused is None, mode
        np.testing.assert_array_equal(tf.convert_to_tensor(g_w).numpy(),
                                      [[0, 0], [4, 4], [0, 0]], err_msg=mode)
    with pytest.raises(ValueError, match="unknown synchronisation mode"):
        variant("nccl")


def test_split_communication_is_the_time_above_the_step_without_it():
    from bench.job import split_communication

    runs = split_communication({"nosync": {"step_ms": 10.0}, "hpcrep": {"step_ms": 12.5},
                                "mpi4py": {"step_ms": 9.0}})
    assert runs["hpcrep"]["comm_ms"] == 2.5 and runs["hpcrep"]["compute_ms"] == 10.0
    assert runs["hpcrep"]["comm_fraction"] == pytest.approx(0.2)
    assert runs["mpi4py"]["comm_ms"] == 0.0 and runs["mpi4py"]["compute_ms"] == 9.0
    assert runs["nosync"]["comm_ms"] == 0.0
    alone = split_communication({"hpcrep": {"step_ms": 12.5}})
    assert alone["hpcrep"]["comm_ms"] is None and alone["hpcrep"]["compute_ms"] is None
