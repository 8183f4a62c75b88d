"""PowerSGD's compiled kernels (native/powersgd.cc) against numpy and against the TensorFlow ops
they replace: the same arithmetic up to rounding, bits independent of the thread count, bad
shapes refused. One process, no MPI."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hpcrep.errors import CollectiveArgumentError  # noqa: E402
from hpcrep.tensorflow import powersgd  # noqa: E402
from hpcrep.tensorflow.powersgd import PowerSGD  # noqa: E402

# Shapes that exercise rows not a multiple of 4 and more than one 128-row block of Back.
SHAPES = [(3, 3, 7, 11), (300, 17), (5, 64), (129, 3)]


@pytest.fixture(name="kernels")
def kernels_fixture(skip_missing):
    from hpcrep.tensorflow import native

    ops = native.ops()
    if ops is None:
        skip_missing(f"hpcrep's compiled op: {native.status()[1]}")
    return ops


def _inputs(shape, r, dtype, seed):
    rng = np.random.default_rng(seed)
    n, m = powersgd.matrix_shape(shape)
    g = rng.standard_normal(shape).astype(dtype)
    e = rng.standard_normal((n, m)).astype(dtype)
    q = rng.standard_normal((m, r)).astype(dtype)
    return g, e, q


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("r", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_three_passes_compute_powersgd_steps_arithmetic(kernels, shape, r, dtype, rtol):
    g, e, q = _inputs(shape, r, dtype, seed=r)
    n, m = powersgd.matrix_shape(shape)
    mat, p = kernels.hpcrep_powersgd_project(g, e, q)
    np.testing.assert_array_equal(mat.numpy(), g.reshape(n, m) + e)  # one add: exact
    m64 = mat.numpy().astype(np.float64)
    np.testing.assert_allclose(p.numpy(), m64 @ q, rtol=rtol, atol=rtol * np.abs(m64).sum(1).max())
    back = kernels.hpcrep_powersgd_back(mat, p)
    ref = m64.T @ p.numpy().astype(np.float64)
    np.testing.assert_allclose(back.numpy(), ref, rtol=rtol, atol=rtol * np.abs(ref).max() * 10)
    approx, error = kernels.hpcrep_powersgd_approx(mat, p, back)
    ref = p.numpy().astype(np.float64) @ back.numpy().astype(np.float64).T
    np.testing.assert_allclose(approx.numpy(), ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    np.testing.assert_array_equal(error.numpy(), mat.numpy() - approx.numpy())
    assert approx.dtype == error.dtype == mat.dtype == tf.as_dtype(dtype)


def test_a_whole_step_matches_the_tensorflow_ops_it_replaces(kernels, monkeypatch):
    variables = [tf.Variable(tf.zeros(s)) for s in SHAPES] + [tf.Variable(tf.zeros([7]))]
    grads = [tf.random.stateless_normal(v.shape, [3, i]) for i, v in enumerate(variables)]
    results = {}
    for name, chosen in (("fused", kernels), ("tensorflow", None)):
        monkeypatch.setattr(powersgd, "fused_kernels", lambda chosen=chosen: chosen)
        psgd = PowerSGD(rank=2)
        steps = []
        for _ in range(3):  # error feedback and Q carry from step to step
            out = psgd.compute_alone(grads, variables)
            steps.append([t.numpy() for t in out])
        results[name] = (steps, [e.numpy() for e in psgd.rank_local_variables()],
                         [q.numpy() for q in psgd.replicated_variables()[1:]])
    for a, b in zip(results["fused"][0], results["tensorflow"][0]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4 * np.abs(y).max())
    for a, b in zip(results["fused"][1] + results["fused"][2],
                    results["tensorflow"][1] + results["tensorflow"][2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())
    # The gradients that are not matrices pass through untouched on both paths.
    np.testing.assert_array_equal(results["fused"][0][0][-1], grads[-1].numpy())


_RUN_WITH_THREADS = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
    from hpcrep.tensorflow import native
    ops = native.ops()
    rng = np.random.default_rng(7)
    g = rng.standard_normal((4608, 512)).astype(np.float32)
    e = rng.standard_normal((4608, 512)).astype(np.float32)
    q = rng.standard_normal((512, 4)).astype(np.float32)
    mat, p = ops.hpcrep_powersgd_project(g, e, q)
    back = ops.hpcrep_powersgd_back(mat, p)
    approx, error = ops.hpcrep_powersgd_approx(mat, p, back)
    digest = [hash(t.numpy().tobytes()) for t in (mat, p, back, approx, error)]
    print("DIGEST", digest)
""")


def test_the_bits_do_not_depend_on_the_thread_count(kernels, tmp_path):
    """Ranks on nodes with different core counts must still apply the same gradients."""
    script = tmp_path / "threads.py"
    script.write_text(_RUN_WITH_THREADS)
    env = dict(os.environ, PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="3")
    digests = []
    for threads in (1, 3):
        run = subprocess.run([sys.executable, str(script), str(threads)], capture_output=True,
                             text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        digests.append([line for line in run.stdout.splitlines() if line.startswith("DIGEST")])
    assert digests[0] and digests[0] == digests[1]


@pytest.mark.parametrize("op,args,message", [
    ("project", lambda: (np.zeros((4, 5), np.float32), np.zeros((4, 6), np.float32),
                         np.zeros((6, 2), np.float32)), "has 20 elements, its error buffer 24"),
    ("project", lambda: (np.zeros((4, 5), np.float32), np.zeros((4, 5), np.float32),
                         np.zeros((6, 2), np.float32)), "Q must be [5, r]"),
    ("back", lambda: (np.zeros((4, 5), np.float32), np.zeros((3, 2), np.float32)),
     "P must be [4, r]"),
    ("approx", lambda: (np.zeros((4, 5), np.float32), np.zeros((4, 2), np.float32),
                        np.zeros((5, 3), np.float32)), "P has 2 columns and Q 3"),
])
def test_bad_shapes_are_refused_with_what_was_wrong(kernels, op, args, message):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)) as caught:
        getattr(kernels, f"hpcrep_powersgd_{op}")(*args())
    assert message in str(caught.value)


def test_integer_gradients_never_reach_the_kernels():
    with pytest.raises(CollectiveArgumentError, match="floating-point"):
        PowerSGD(rank=2).build([tf.Variable(tf.zeros([4, 5], tf.int32))])
