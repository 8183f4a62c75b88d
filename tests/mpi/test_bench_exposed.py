"""bench.exposed: a benchmark job's traced steps give the exposed communication and overlap that
``hpcrep bench`` reports (real collectives on the compiled path, a real merged timeline)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import hpcrep.tensorflow as hvd
from bench.exposed import traced_figures
from hpcrep.analysis import trace, validate

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True, scope="module")
def _init():
    hvd.init()


def test_traced_steps_give_exposed_communication_and_overlap(world, shared_dir):
    r, n = world
    if n < 2:
        pytest.skip("needs 2 ranks: one rank exchanges nothing")
    variables = [tf.Variable(tf.fill(shape, 0.01 * (i + 1)))
                 for i, shape in enumerate([(64, 256), (256,), (256, 128), (128,), (128, 10)])]
    x = tf.constant(np.random.default_rng(r).random((32, 64)), tf.float32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            h = x
            for w in variables:
                h = tf.nn.relu(h @ w) if len(w.shape) == 2 else h + w
            loss = tf.reduce_mean(h ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)
        return loss

    step().numpy()  # traced before the timeline starts, as a benchmark's step is
    path = os.path.join(shared_dir, "job.trace.json")
    figures = traced_figures(lambda: step().numpy(), path, steps=3)
    if r != 0:
        assert figures is None
        return
    grad_bytes = sum(int(np.prod(v.shape)) * 4 for v in variables)
    assert figures["steps"] == 3 and figures["file"] == "job.trace.json"
    assert figures["bytes"] == grad_bytes  # every gradient, once per step, on each rank
    assert figures["mpi_ms"] > 0 and 0.0 <= figures["overlap"] <= 1.0
    assert 0.0 <= figures["exposed_ms"] <= figures["step_ms"]
    assert figures["compute_ms"] + figures["exposed_ms"] == pytest.approx(figures["step_ms"])
    events = trace.load(path)
    assert validate.problems(events, n) == []
    steps = [e for e in events if e.get("cat") == "step" and e["pid"] == 0]
    assert [e["args"]["source"] for e in steps] == ["loop"] * 3
