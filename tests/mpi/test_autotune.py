"""HPCREP_AUTOTUNE on real ranks: the tuner tries settings while a model trains, every rank
switches at the same step, the ranks stay bitwise equal, and the tuned exchange computes what
the untuned one does (up to the summation grouping of the settings it tried)."""

import csv

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from hpcrep.comm import autotune as search
from hpcrep.tensorflow import autotune, native

STEPS = 24


def train(steps: int) -> np.ndarray:
    """Train a 3-layer MLP (600 x 600 kernels, 1.44 MB each: traced at a 1 MiB threshold, one
    bucket each, which the engine can fuse or cut) for ``steps`` steps of rank-dependent data;
    return its weights, flattened."""
    init = np.random.default_rng(7)
    ws = [tf.Variable(init.normal(0, 0.05, (600, 600)).astype(np.float32)) for _ in range(3)]
    data = np.random.default_rng(hvd.rank())
    xs = data.normal(size=(steps, 8, 600)).astype(np.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for w in ws:
                h = tf.tanh(h @ w)
            loss = tf.reduce_mean(h ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, ws)
        for w, g in zip(ws, grads):
            w.assign_sub(0.5 * g)

    for x in xs:
        step(x)
    return np.concatenate([w.numpy().ravel() for w in ws])


@pytest.mark.parametrize("fp16", [False, True], ids=["float32", "fp16_allowed"])
def test_tuned_training_settles_switches_together_and_keeps_ranks_equal(world, monkeypatch,
                                                                        tmp_path, fp16):
    r, n = world
    if n < 2:
        pytest.skip("needs 2 ranks (one rank exchanges nothing)")
    if not native.active():
        pytest.skip("autotune tunes the compiled path, which is off here")
    autotune.reset()
    log = tmp_path / "autotune.csv"
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "1MiB")  # so every threshold is a choice
    plain = train(STEPS)
    for name, value in (("HPCREP_AUTOTUNE", "1"), ("HPCREP_AUTOTUNE_WARMUP", "0"),
                        ("HPCREP_AUTOTUNE_STEPS", "1"), ("HPCREP_AUTOTUNE_WINDOW", "50"),
                        ("HPCREP_AUTOTUNE_LOG", str(log)),
                        ("HPCREP_AUTOTUNE_COMPRESSION", "1" if fp16 else "0")):
        monkeypatch.setenv(name, value)
    tuned = train(STEPS)
    tuner = autotune.current()
    assert tuner is not None and tuner.steps == STEPS
    # Every rank applied the same settings from the same steps on. (A window of 50 steps: no
    # look for drift within the test, whose millisecond steps vary by more than 15 %.)
    history = [(s, t.fusion, t.chunk, t.fp16) for s, t in tuner.history]
    assert hvd.allgather_object(history) == [history] * n
    assert len({h[1:] for h in history}) >= 5, history
    weights = hvd.allgather_object(tuned.tobytes())
    assert weights == [weights[0]] * n
    if fp16:  # the last setting timed sends float16: results differ by its rounding
        assert any(h[3] for h in history), history
        np.testing.assert_allclose(tuned, plain, rtol=1e-2, atol=1e-3)
    else:
        np.testing.assert_allclose(tuned, plain, rtol=1e-5, atol=1e-6)
    if r == 0:
        # A whole search (at 1 step a setting: 4 piece sizes, 4 more thresholds, up to 3 more
        # piece sizes at the best threshold if it is not the starting one, float16 if allowed)
        # fits in 24 steps; its log has a row each.
        assert tuner.search.settled and tuner.search.settled_at <= STEPS, tuner.search.trials
        rows = list(csv.DictReader(log.open()))
        assert len(rows) == len(tuner.search.trials)
        assert 8 + fp16 <= len(rows) <= 11 + fp16
        assert [int(row["fp16"]) for row in rows].count(1) == int(fp16)
        cells = {(int(row["fusion_bytes"]), int(row["chunk_bytes"])) for row in rows}
        assert cells <= {(f, c) for f in search.FUSION_CHOICES for c in search.CHUNK_CHOICES}
        assert tuner.search.best[0] in tuner.history_settings()


def test_float16_wire_gives_the_bits_of_compression_fp16(world):
    """The engine's fp16 wire (what the tuner may choose where allowed) packs float32 as float16,
    sums in float16 and unpacks: the same bits as Compression.fp16 around the exchange."""
    r, n = world
    if n < 2 or not native.active():
        pytest.skip("needs 2 ranks and the compiled path")
    from hpcrep.comm import world as comm_world

    rng = np.random.default_rng([r, 11])
    tensors = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((300, 7), (5,), (64,))]
    native.tune(comm_world.communicator(), 16 << 20, 4 << 20, True)
    try:
        with autotune.tuned_scope():
            wire = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))(tensors)
    finally:
        native.tune(comm_world.communicator(), 16 << 20, 4 << 20, False)
    cast = tf.function(lambda ts: hvd.grouped_allreduce(
        ts, op=hvd.Sum, compression=hvd.Compression.fp16))(tensors)
    full = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))(tensors)
    for w, c in zip(wire, cast):
        assert w.dtype == tf.float32
        np.testing.assert_array_equal(w.numpy(), c.numpy())
    assert any(np.any(w.numpy() != f.numpy()) for w, f in zip(wire, full))  # half rounding shows
