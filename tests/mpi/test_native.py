"""The compiled allreduce path (hpcrep/tensorflow/native): the same bits as the Python path, fused
independent calls, gradient buckets that overlap the backward pass, and its errors.

Each test compares the two paths in one process: ``HPCREP_NATIVE`` is read when a function is
traced, so a function traced under ``off`` keeps the Python path.
"""

from __future__ import annotations

import contextlib
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.tensorflow import native


@pytest.fixture
def compiled(skip_missing):
    """Require the compiled path (a skip for a missing build fails under CI=true)."""
    hvd.init()
    if not native.active():
        skip_missing(f"the compiled allreduce op: {native.status()[1]}")
    return hc.rank(), hc.size()


@contextlib.contextmanager
def setting(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def both_paths(fn, *args):
    """Return fn's results traced on the compiled path and on the Python path, as numpy.

    Fails unless the compiled op really reduced under ``on`` (its engine's request counter,
    ``native.stats``, went up) and did not under ``off``: a dtype that silently fell back to
    the Python path would otherwise compare the Python path with itself. At 1 rank nothing is
    exchanged on either path, so there is nothing to count.
    """
    out = []
    for mode in ("on", "off"):
        before = native.stats(hc.communicator())[1]
        with setting("HPCREP_NATIVE", mode):
            results = tf.function(fn)(*args)
        out.append([r.numpy() for r in tf.nest.flatten(results)])
        requests = native.stats(hc.communicator())[1] - before
        if hc.size() > 1:
            assert (requests > 0) == (mode == "on"), \
                f"HPCREP_NATIVE={mode}: the compiled op reduced {requests} request(s)"
    return out


def assert_bitwise_equal_across_ranks(arrays):
    gathered = hc.allgather_object([np.ascontiguousarray(a).tobytes() for a in arrays])
    assert all(g == gathered[0] for g in gathered)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64"])
@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max", "Product"])
def test_compiled_path_gives_the_python_paths_bits(compiled, dtype, op):
    r, n = compiled
    rng = np.random.default_rng(100 + r)
    values = [rng.normal(size=shape) * 3 for shape in ((7,), (3, 5), (33,), ())]
    tensors = [tf.cast(tf.constant(v), dtype) for v in values]
    reduce_op = getattr(hvd, op)
    native_out, python_out = both_paths(
        lambda *ts: hvd.grouped_allreduce(list(ts), op=reduce_op), *tensors)
    assert len(native_out) == len(python_out) == len(tensors)
    for a, b in zip(native_out, python_out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    assert_bitwise_equal_across_ranks(native_out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_buffers_beyond_the_chunk_size_give_the_same_bits_on_both_paths(compiled, dtype):
    """HPCREP_ALLREDUCE_CHUNK cuts a fused buffer into several MPI_Allreduce calls at the same
    element boundaries on both paths (here 200 bytes: dozens of pieces, the last one short):
    the same bits on both, equal on every rank, and the sums right."""
    r, n = compiled
    rng = np.random.default_rng(7 + r)
    values = [rng.normal(size=shape) * 3 for shape in ((1000,), (37, 11), (5,))]
    tensors = [tf.cast(tf.constant(v), dtype) for v in values]
    with setting("HPCREP_ALLREDUCE_CHUNK", "200"):
        native_out, python_out = both_paths(
            lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum), *tensors)
    everyone = hc.allgather_object([t.numpy().astype(np.float64) for t in tensors])
    assert len(native_out) == len(python_out) == len(values)
    for i, (a, b) in enumerate(zip(native_out, python_out)):
        np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
        expected = sum(rank_values[i] for rank_values in everyone)
        if dtype == "int64":
            np.testing.assert_array_equal(a, expected.astype(np.int64))
        else:
            # n values summed in dtype, in any order (rounding after each addition, or once at
            # the end) err by at most (n - 1) * u * sum(|x|), u being dtype's unit roundoff
            # (2**-24 for float32, 2**-11 for float16); 1.01 covers the second-order term. At
            # one rank the result must be exact.
            u = {"float32": 2.0**-24, "float16": 2.0**-11}[dtype]
            bound = 1.01 * (n - 1) * u * sum(np.abs(rank_values[i]) for rank_values in everyone)
            error = np.abs(a.astype(np.float64) - expected)
            assert np.all(error <= bound), f"error {error.max()} exceeds the rounding bound"
    assert_bitwise_equal_across_ranks(native_out)


def test_scale_factors_and_integer_average_match(compiled):
    r, n = compiled
    x = tf.constant([3 * r + 1, -r - 1, 7], tf.int64)
    y = tf.constant([0.1 * (r + 1), 2.5], tf.float32)
    native_out, python_out = both_paths(
        lambda a, b: [hvd.allreduce(a), hvd.allreduce(b, op=hvd.Sum, prescale_factor=0.3,
                                                      postscale_factor=1.7)], x, y)
    assert len(native_out) == len(python_out) == 2
    for a, b in zip(native_out, python_out):
        np.testing.assert_array_equal(a, b)
    ints = np.array([3 * k + 1 for k in range(n)]), np.array([-k - 1 for k in range(n)])
    np.testing.assert_array_equal(native_out[0], [ints[0].sum() // n, ints[1].sum() // n, 7])


def test_independent_allreduces_in_one_function_are_fused(compiled):
    r, n = compiled
    if n < 2:
        pytest.skip("needs 2 ranks")
    xs = [tf.fill([256], float(r + i)) for i in range(53)]
    step = tf.function(lambda *ts: [hvd.allreduce(t, op=hvd.Sum, name=f"m{i}")
                                    for i, t in enumerate(ts)])
    step(*xs)
    before = native.stats(hc.communicator())
    outs = step(*xs)
    cycles, requests = (a - b for a, b in zip(native.stats(hc.communicator()), before))
    assert requests == 53
    assert cycles < 53, f"53 separate allreduces took {cycles} exchanges: nothing was fused"
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.full(256, sum(k + i for k in range(n))))


def test_unknown_static_shapes(compiled):
    r, n = compiled
    fn = tf.function(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum),
                     input_signature=[tf.TensorSpec([None], tf.float32),
                                      tf.TensorSpec([None, 3], tf.float32)])
    a, b = fn(tf.ones([5]) * r, tf.ones([17, 3]))
    np.testing.assert_array_equal(a, np.full(5, sum(range(n))))
    np.testing.assert_array_equal(b, np.full((17, 3), n))


def _train(overlap: str, mode: str, steps: int = 3) -> list[np.ndarray]:
    """Train a small conv net with DistributedOptimizer; return its trainable weights."""
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.BatchNormalization(), keras.layers.Flatten(),
                              keras.layers.Dense(5), keras.layers.Dense(3)])
    hvd.broadcast_variables(model.variables, root_rank=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    rng = np.random.default_rng(hc.rank())
    x = tf.constant(rng.normal(size=(6, 8, 8, 3)), tf.float32)
    y = tf.constant(rng.integers(0, 3, 6))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    with setting("HPCREP_OVERLAP", overlap), setting("HPCREP_NATIVE", mode), \
            setting("HPCREP_FUSION_THRESHOLD", "256"):  # several buckets even for a tiny net
        for _ in range(steps):
            step()
    return [v.numpy() for v in model.trainable_variables]  # BN statistics stay per rank


def test_overlapped_buckets_train_the_same_weights(compiled):
    """Buckets in reverse layer order, launched during the backward pass: the same weights,
    bitwise, as one exchange after it and as the Python path, and equal on every rank."""
    overlapped = _train("1", "on")
    for other in (_train("0", "on"), _train("1", "off")):
        assert len(overlapped) == len(other) == 8  # 2 conv, 2 BN, 2 x 2 dense
        for a, b in zip(overlapped, other):
            np.testing.assert_array_equal(a, b)
    assert_bitwise_equal_across_ranks(overlapped)


def _enqueue_ancestors(overlap: str) -> list[set]:
    """Trace a 3-layer step; return, per gradient bucket in launch order, the ops it waits for
    (data and control inputs, not the chain of earlier enqueues)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(4),
                              keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    x = tf.ones([2, 4])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    with setting("HPCREP_FUSION_THRESHOLD", "64"), setting("HPCREP_OVERLAP", overlap):
        graph = tf.function(step).get_concrete_function().graph
    enqueues = [op for op in graph.get_operations() if op.type == "HpcrepAllreduceStart"]

    def ancestors(op, seen):
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in seen and parent.type != "HpcrepAllreduceStart":
                seen.add(parent)
                ancestors(parent, seen)
        return seen

    return [ancestors(op, set()) for op in enqueues]


def test_overlap_starts_exchanges_before_the_backward_pass_ends(compiled):
    """The first bucket (the last layer's gradients) waits only for them; the first layer's
    kernel gradient (a MatMul) feeds a later bucket. With HPCREP_OVERLAP=0 every bucket waits
    for every gradient."""
    if compiled[1] < 2:
        pytest.skip("needs 2 ranks: one rank exchanges nothing")
    buckets = _enqueue_ancestors("1")
    assert len(buckets) >= 2
    later_only = buckets[-1] - buckets[0]
    assert any(op.type == "MatMul" for op in later_only), \
        "the first bucket waits for the first layer's gradient: no overlap"
    buckets = _enqueue_ancestors("0")
    assert not any(op.type == "MatMul" for op in buckets[-1] - buckets[0])


def test_inter_op_threads_follow_the_spare_cores(compiled, monkeypatch):
    """With one inter-op thread TensorFlow runs the weight gradients the backward pass queued
    newest first, the last layers' last, so the overlapped graph overlaps on paper only: every
    bucket completed at the end of the backward pass (ResNet-50 on the test cluster). So a rank
    gets two where its node has a core to spare, one where ranks already take every core (where
    a second only competes with the communication thread), and what HPCREP_INTER_OP_THREADS
    says when it is set."""
    from hpcrep.tensorflow.basics import inter_op_threads, threads_per_rank

    at_init = os.environ.get("HPCREP_INTER_OP_THREADS")
    monkeypatch.delenv("HPCREP_INTER_OP_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    intra = threads_per_rank()
    automatic = inter_op_threads(intra)
    assert automatic == (2 if cores > hc.local_size() * intra else 1)
    assert inter_op_threads(cores) == 1              # ranks x threads >= cores: none spare
    # What hvd.init() configured (the runtime's pools are fixed from then on).
    assert tf.config.threading.get_inter_op_parallelism_threads() == int(at_init or automatic)
    monkeypatch.setenv("HPCREP_INTER_OP_THREADS", "3")
    assert inter_op_threads(intra) == 3


def test_mismatch_on_the_compiled_path_raises_on_every_rank(compiled):
    r, n = compiled
    if n < 2:
        pytest.skip("needs 2 ranks")
    with pytest.raises(tf.errors.FailedPreconditionError, match="ranks disagree") as info:
        hvd.allreduce(tf.ones([3 + r]), name="shape_differs")
    assert "shape_differs" in str(info.value)
    with pytest.raises(tf.errors.OpError, match="ranks disagree"):
        tf.function(lambda: hvd.allreduce(tf.ones([3 + r])))()
    np.testing.assert_array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum), np.full(2, n))


def test_status_says_which_path_is_active(compiled):
    assert native.status() == (True, native.status()[1])
    assert "compiled op" in native.status()[1]
    with setting("HPCREP_NATIVE", "off"):
        assert native.status()[0] is False and "Python path" in native.status()[1]


def test_the_stall_watchdog_watches_the_communication_thread(compiled, monkeypatch, capfd):
    """Rank 0 computes for 4.5 s before its allreduce; the others' communication threads wait
    with a 6 s timeout: the watchdog warns at 3 s (it sees the thread's wait) but lets the
    result arrive."""
    import time

    r, n = compiled
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", "6")
    step = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="slow.rank.native"))
    step(tf.ones([4]))  # traced and warmed up on every rank
    hc.barrier()
    if r == 0:
        time.sleep(4.5)
    total = step(tf.fill([4], float(r + 1)))
    np.testing.assert_array_equal(total, np.full(4, n * (n + 1) / 2))
    if n > 1 and r != 0:
        # The warning is the outcome that shows the wait was seen (no wall-clock assert here:
        # a rank descheduled on a loaded machine would measure its own wait short).
        err = capfd.readouterr().err
        assert "allreduce (compiled path)" in err and "slow.rank.native" in err, err[-2000:]
