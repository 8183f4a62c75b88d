"""The composition matrix: every explicit-API training feature alone and with every other, driven
by ``model.fit`` and by a custom ``tf.function`` loop, either trains (finite losses, weights
bitwise equal on every rank, and equal to the run without ZeRO/tape/timeline/autotune where the
exchange is exact) or is refused on every rank with the :mod:`hpcrep.errors` exception and
message of :mod:`composition_table`. A crash of another kind, a hang or ranks that differ fail.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.errors
import hpcrep.tensorflow as hvd
from hpcrep.comm import adasum
from hpcrep.tensorflow import autotune

import composition_table as table

pytestmark = pytest.mark.timeout(120)

B, STEPS = 4, 2
_results: dict[tuple[frozenset, str], list[np.ndarray]] = {}


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()
    yield
    keras.mixed_precision.set_global_policy("float32")


def make_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    # kernels 5x8 and 8x3: both worth compressing at PowerSGD rank 2
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def local_data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(B * STEPS, 5)).astype("float32")
    return x, np.stack([x.sum(1), x[:, 0] * x[:, 1], np.sin(x[:, 2])], 1).astype("float32")


def exchange_options(features: frozenset) -> dict[str, Any]:
    """The options of the gradient exchange (the optimizer's, or the tape's)."""
    options: dict[str, Any] = {}
    if "powersgd" in features:
        options["compression"] = hvd.Compression.powersgd(2)
    if "fp16" in features:
        options["compression"] = hvd.Compression.fp16
    if "adasum" in features:
        options["op"] = hvd.Adasum
    return options


def make_optimizer(features: frozenset, exchange: dict[str, Any]) -> keras.optimizers.Optimizer:
    opt: keras.optimizers.Optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    if "mixed" in features:
        opt = keras.optimizers.LossScaleOptimizer(opt)
    if "tape" in features:
        return opt  # the tape reduces
    options = dict(exchange)
    if "zero" in features:
        options["shard_optimizer_state"] = True
    if "accum" in features:
        options["backward_passes_per_step"] = 2
    return hvd.DistributedOptimizer(opt, **options)


def fit(features: frozenset) -> tuple[keras.Model, list[float]]:
    x, y = local_data(hc.rank())
    model = make_model()
    model.compile(make_optimizer(features, exchange_options(features)), "mse",
                  jit_compile=False)
    history = model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return model, list(history.history["loss"])


def loop(features: frozenset) -> tuple[keras.Model, list[float]]:
    x, y = local_data(hc.rank())
    model = make_model()
    exchange = exchange_options(features)
    opt = make_optimizer(features, exchange)
    variables = model.trainable_variables
    opt.build(variables)
    if "tape" in features and "powersgd" in features:
        exchange["compression"].build(variables, opt)
    mixed = "mixed" in features

    @tf.function(jit_compile=False)
    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(xb), tf.float32) - yb))
            target = opt.scale_loss(loss) if mixed else loss
        if "tape" in features:
            tape = hvd.DistributedGradientTape(tape, **exchange)
        opt.apply(tape.gradient(target, variables), variables)
        return loss

    losses = [float(step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])) for s in range(STEPS)]
    return model, losses


def train(features: frozenset, driver: str, tmp_path: Any, monkeypatch: Any) -> list[np.ndarray]:
    """Train one case; return the weights. Collective."""
    key = (features, driver)
    if key in _results:
        return _results[key]
    keras.mixed_precision.set_global_policy("mixed_float16" if "mixed" in features
                                            else "float32")
    if "autotune" in features:
        for name, value in (("HPCREP_AUTOTUNE", "1"), ("HPCREP_AUTOTUNE_WARMUP", "0"),
                            ("HPCREP_AUTOTUNE_STEPS", "1")):
            monkeypatch.setenv(name, value)
        autotune.reset()
    timeline = os.path.join(str(tmp_path), "timeline.json")
    if "timeline" in features:
        hvd.start_timeline(timeline)
    try:
        model, losses = (fit if driver == "fit" else loop)(features)
    finally:
        if "timeline" in features:
            hvd.stop_timeline()
        if "autotune" in features:
            for name in ("HPCREP_AUTOTUNE", "HPCREP_AUTOTUNE_WARMUP", "HPCREP_AUTOTUNE_STEPS"):
                monkeypatch.delenv(name)
            autotune.reset()
        keras.mixed_precision.set_global_policy("float32")
    assert len(losses) >= 1 and all(np.isfinite(losses)), f"losses {losses}"
    weights = [np.asarray(w) for w in model.get_weights()]
    assert all(np.isfinite(w).all() for w in weights)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
    everyone = hc.allgather_object(digest)
    assert len(set(everyone)) == 1, f"weights differ across ranks: {everyone}"
    start = _start_weights()
    assert any(not np.array_equal(w, s) for w, s in zip(weights, start)), "nothing trained"
    if "timeline" in features and hc.rank() == 0:
        with open(timeline) as f:
            events = json.load(f)["traceEvents"]
        cats = {e.get("cat") for e in events}
        wanted = {"step", "collective"} if hc.size() > 1 else {"step"}  # 1 rank: no exchange
        assert wanted <= cats, f"the timeline records {cats}"
    _results[key] = weights
    return weights


def _start_weights() -> list[np.ndarray]:
    if "start" not in _start:
        _start["start"] = make_model().get_weights()
    return _start["start"]


_start: dict[str, list[np.ndarray]] = {}

CASES = [(f, d) for f, d in table.cases() if table.cell(f, d) != table.NA]


@pytest.mark.parametrize("features,driver", CASES,
                         ids=[table.case_id(f, d) for f, d in CASES])
def test_pair(features: frozenset, driver: str, tmp_path: Any, monkeypatch: Any) -> None:
    expected = table.cell(features, driver)
    if "adasum" in features and not adasum.is_power_of_two(hc.size()):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    if expected == table.RUNS:
        weights = train(features, driver, tmp_path, monkeypatch)
        ref = table.reference(features)
        if ref is not None:
            want = train(ref, driver, tmp_path, monkeypatch)
            for w, r in zip(weights, want):
                np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
        return
    kind, message = expected
    with pytest.raises(getattr(hpcrep.errors, kind)) as err:
        train(features, driver, tmp_path, monkeypatch)
    assert str(err.value) == message
    text = str(err.value).lower()
    for f in features:
        assert any(n.lower() in text for n in table.NAMES[f]), (f, str(err.value))
    assert all(hc.allgather_object(True))



@pytest.mark.parametrize("driver", table.DRIVERS)
def test_sharded_state_under_a_loss_scale_optimizer(driver: str) -> None:
    """What the ZeRO + mixed precision refusal advises, LossScaleOptimizer(DistributedOptimizer(
    opt, shard_optimizer_state=True)), trains and equals the unsharded mixed-precision run."""
    want = train(frozenset({"mixed"}), driver, None, None)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = local_data(hc.rank())
        model = make_model()
        opt = keras.optimizers.LossScaleOptimizer(hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.05, momentum=0.9), shard_optimizer_state=True))
        if driver == "fit":
            model.compile(opt, "mse", jit_compile=False)
            model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
        else:
            variables = model.trainable_variables
            opt.build(variables)

            @tf.function(jit_compile=False)
            def step(xb: tf.Tensor, yb: tf.Tensor) -> None:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(tf.cast(model(xb), tf.float32) - yb))
                    scaled = opt.scale_loss(loss)
                opt.apply(tape.gradient(scaled, variables), variables)

            for s in range(STEPS):
                step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = [np.asarray(w) for w in model.get_weights()]
    digests = hc.allgather_object(hashlib.sha256(b"".join(w.tobytes() for w in weights))
                                  .hexdigest())
    assert len(set(digests)) == 1, f"weights differ across ranks: {digests}"
    for w, r in zip(weights, want):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shard", [False, True], ids=["plain", "sharded"])
def test_timeline_marks_steps_when_compile_adds_the_loss_scale_optimizer(shard: bool,
                                                                         tmp_path: Any) -> None:
    """Under mixed_float16, ``compile(hvd.DistributedOptimizer(opt))`` makes
    LossScaleOptimizer(DistributedOptimizer(opt)), which reduces in the outer apply: the
    timeline still marks each training step."""
    path = os.path.join(str(tmp_path), "timeline.json")
    keras.mixed_precision.set_global_policy("mixed_float16")
    hvd.start_timeline(path)
    try:
        x, y = local_data(hc.rank())
        model = make_model()
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                               shard_optimizer_state=shard),
                      "mse", jit_compile=False)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    finally:
        hvd.stop_timeline()
        keras.mixed_precision.set_global_policy("float32")
    if hc.rank() == 0:
        with open(path) as f:
            steps = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "step"]
        per_rank = {r: sum(e.get("pid") == r for e in steps) for r in range(hc.size())}
        assert set(per_rank.values()) == {STEPS}, f"steps marked per rank {per_rank}, {STEPS} run"
