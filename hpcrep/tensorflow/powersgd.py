"""PowerSGD: low-rank gradient compression with error feedback (Vogels et al., NeurIPS 2019).

``hvd.Compression.powersgd(rank=2, warmup_steps=10)`` returns a :class:`PowerSGD`, accepted
wherever a compression is (``DistributedOptimizer``, ``DistributedGradientTape``, the
Replicator's ``wrap_optimizer``; ``HPCREP_COMPRESSION=powersgd:2`` in transparent mode). Unlike
``Compression.none``/``fp16`` it is not a per-tensor transform: it keeps state from step to step
and needs two exchanges per step, so :class:`~hpcrep.tensorflow.gradients.GradientReducer` hands
it the whole list of dense gradients instead of the bucketed allreduce.

Each step, for every matrix-shaped gradient ``G`` (rank 2 or more, reshaped to ``[n, m]`` with
``m`` its last dimension and ``n`` the product of the others: a conv kernel ``[kh, kw, cin,
cout]`` becomes ``[kh*kw*cin, cout]``), with this rank's error buffer ``E`` (``[n, m]``) and a
persistent ``Q`` (``[m, r]``, the same on every rank)::

    M = G + E;  P = M Q;  P = average of P over ranks;  P = orthonormal basis of P (QR)
    Q = M^T P;  Q = average of Q over ranks;  G_hat = P Q^T;  E = M - G_hat

and ``G_hat`` is the gradient applied. All P's of a step travel in one fused allreduce, together
with the gradients that are not compressed (vectors such as biases and batch-norm scales, and
matrices for which ``r * (n + m) >= n * m``, so compression would not send fewer bytes: among
them every matrix with ``min(n, m) <= r``), and all Q's in a second one; both take the compiled
path where it is active. The result depends only on the ranks' average of ``M``: when that
average has rank ``r`` or less, ``G_hat`` is the plain average of the gradients up to rounding.

Where the compiled path is active (:func:`hpcrep.tensorflow.native.active`), the passes over
the gradients run as three fused kernels (``native/powersgd.cc``: ``M = G + E`` with ``P = M Q``;
``M^T P``; ``G_hat = P Q^T`` with ``E = M - G_hat``), seven passes over the matrices' bytes where
TensorFlow's matmuls and element-wise ops make about nine; otherwise those ops compute the same
step (equal up to rounding). On one core per rank these passes, not the flops, are PowerSGD's
cost.

Warm-up: for the first ``warmup_steps`` steps every gradient is averaged uncompressed (one
bucketed exchange, as without compression); the error buffers stay zero and ``Q`` keeps its
starting value until compression begins. The step counter counts exchanges (with
``backward_passes_per_step=k``, one per k passes).

Determinism: the starting ``Q`` comes from a seeded normal generator (numpy, ``seed`` and the
matrix's position) and is orthonormalised in float64, so every rank starts from the same bits
without communicating (needed for ``P`` to be ``average(M) Q``, not for agreement). ``G_hat`` is
a deterministic function of the two averages alone, which every rank receives bitwise equal, so
every rank applies bitwise the same gradients. float16/bfloat16 gradients are compressed in
float32 and cast back.

Error buffers: their mean over ranks is what the applied gradients lag the true average by (the
sum of the applied gradients over steps equals the sum of the averages minus it), and it stays
bounded. Each rank's own ``E`` also carries the running sum of that rank's gradients' differences
from the average, which only the mean cancels, so one rank's ``E`` can grow like a random walk
(as in the paper's algorithm: ``e_w = M_w - decompress(C)``).

State: per compressed matrix ``Q`` (the same on every rank) and ``E`` (this rank's own), plus
the step counter. A ``DistributedOptimizer`` makes ``Q`` and the counter its own variables when it
is built (so ``optimizer.variables``, ``save_weights``, ``BackupAndRestore`` and the replica check
see them); ``E`` differs between ranks by design, so it is kept out of ``optimizer.variables``
(rank 0's copy is what those paths would write and restore everywhere) and hpcrep's checkpoints
(:func:`hpcrep.tensorflow.checkpoint_callback.training_state`) gather every rank's ``E`` and
give each rank its own back on restore. Paths that save only ``optimizer.variables`` (Keras
weights files, ``BackupAndRestore``) restart the error feedback from zero, and so does a
restore at another number of ranks. A tape has no lifetime of its own (one is made per step),
so the state lives in the :class:`PowerSGD` object: make it once and pass the same object each
step, and call ``compression.build(model.trainable_variables, optimizer)`` before the first step
so that the optimizer (and its checkpoints) carries it too.

Not supported (refused with a message naming the fix): ``op`` other than Average,
``gradient_predivide_factor``, integer gradients. One ``PowerSGD`` object serves one optimizer
or one training loop: give each its own ``Compression.powersgd(...)``.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow import collectives
from hpcrep.tensorflow.variables import variable_key

_LOW_PRECISION = (tf.float16, tf.bfloat16)

# Optimizer -> the PowerSGD whose state it carries (so checkpoints find the per-rank buffers).
_carried: "weakref.WeakKeyDictionary[Any, PowerSGD]" = weakref.WeakKeyDictionary()


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """Return ``(n, m)``: a gradient of ``shape`` as a matrix (``m``: its last dimension). Local."""
    return int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])


def compresses(shape: Sequence[Optional[int]], rank: int) -> bool:
    """Return True if a gradient of ``shape`` is sent as rank-``rank`` factors: a matrix (two or
    more dimensions, all known) for which ``rank * (n + m) < n * m``. Local."""
    if len(shape) < 2 or any(d is None for d in shape):
        return False
    n, m = matrix_shape(shape)
    return rank * (n + m) < n * m


def starting_q(m: int, rank: int, seed: int, index: int) -> np.ndarray:
    """Return the starting ``Q`` (``[m, rank]``, float64, orthonormal columns) of the
    ``index``-th compressed matrix: the same bits on every rank, no communication. Local."""
    q = np.random.default_rng([seed, index]).standard_normal((m, rank))
    for j in range(rank):  # Gram-Schmidt, twice for accuracy
        for _ in range(2):
            q[:, j] -= q[:, :j] @ (q[:, :j].T @ q[:, j])
        q[:, j] /= np.linalg.norm(q[:, j])
    return q


@dataclasses.dataclass
class _Matrix:
    """One compressed gradient: its shape, compute dtype and state."""

    index: int
    shape: tuple[int, ...]
    n: int
    m: int
    dtype: tf.DType
    q: Any
    error: tf.Variable


class PowerSGD:
    """Rank-``rank`` PowerSGD compression with error feedback (see the module's docstring).

    Args:
        rank: columns of P and Q (1 or more; 2-4 are usual). A matrix with ``min(n, m) <= rank``
            (more generally ``rank * (n + m) >= n * m``) is averaged uncompressed.
        warmup_steps: exchanges averaged uncompressed before compression starts (0 or more).
        seed: seed of the starting ``Q`` (the same on every rank).

    Raises:
        CollectiveArgumentError: ``rank`` not an int or below 1, ``warmup_steps`` negative.
    """

    def __init__(self, rank: int = 1, warmup_steps: int = 0, seed: int = 0) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise CollectiveArgumentError(
                f"Compression.powersgd(rank=...) takes an int (the columns of the low-rank "
                f"factors), got {rank!r} ({type(rank).__name__}); pass e.g. rank=2")
        if rank < 1:
            raise CollectiveArgumentError(
                f"Compression.powersgd(rank=...) must be 1 or more, got {rank}; pass e.g. rank=2 "
                "(or Compression.none for no compression)")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, (int, np.integer)) \
                or warmup_steps < 0:
            raise CollectiveArgumentError(
                f"Compression.powersgd(warmup_steps=...) must be an int >= 0, got "
                f"{warmup_steps!r}")
        self.rank = int(rank)
        self.warmup_steps = int(warmup_steps)
        self.seed = int(seed)
        self._matrices: Optional[dict[Any, _Matrix]] = None
        self._step: Any = None
        self._owner: Optional[weakref.ref] = None

    def __repr__(self) -> str:
        return (f"Compression.powersgd(rank={self.rank}, warmup_steps={self.warmup_steps}, "
                f"seed={self.seed})")

    # -- state -------------------------------------------------------------------------------

    @property
    def built(self) -> bool:
        """Whether the state exists."""
        return self._matrices is not None

    @property
    def step(self) -> Any:
        """The exchange counter (int64 variable; None before :meth:`build`)."""
        return self._step

    def build(self, variables: Sequence[Any], optimizer: Any = None) -> None:
        """Create the state for the gradients of ``variables`` (their order is the state's).

        With ``optimizer`` (a Keras optimizer), ``Q`` and the step counter are created as that
        optimizer's variables (``optimizer.add_variable``), after those it has, so its
        checkpoints hold them; otherwise as plain ``tf.Variable``. Error buffers are always plain
        variables of this object. A second call for the same variables is a no-op. Local.

        Raises:
            CollectiveArgumentError: integer variables, or state built already for other
                variables or another optimizer.
        """
        variables = list(variables)
        keys = [variable_key(v) for v in variables]
        if self._matrices is not None:
            owner = self._owner() if self._owner is not None else None
            if set(keys) >= set(self._matrices) and (optimizer is None or optimizer is owner):
                return
            raise CollectiveArgumentError(
                f"this {self!r} keeps state for other variables"
                + (" or another optimizer" if optimizer is not None else "")
                + "; give each optimizer or training loop its own Compression.powersgd(...)")
        for v in variables:
            _check_floating(tf.as_dtype(v.dtype), getattr(v, "path", getattr(v, "name", "?")))
        with tf.init_scope():
            self._create(variables, keys, optimizer)

    def _create(self, variables: list, keys: list, optimizer: Any) -> None:
        def make(shape: tuple, dtype: tf.DType, value: np.ndarray, name: str) -> Any:
            if optimizer is None:
                return tf.Variable(tf.constant(value, dtype), trainable=False, name=name)
            return optimizer.add_variable(
                shape=shape, dtype=dtype.name, name=name,
                initializer=lambda shape, dtype=None: tf.constant(value, dtype))

        self._step = make((), tf.int64, np.zeros((), np.int64), "powersgd_step")
        matrices: dict[Any, _Matrix] = {}
        for key, v in zip(keys, variables):
            shape = tuple(v.shape)
            if not compresses(shape, self.rank):
                continue
            n, m = matrix_shape(shape)
            dtype = tf.as_dtype(v.dtype)
            dtype = tf.float32 if dtype in _LOW_PRECISION else dtype
            index = len(matrices)
            q = make((m, self.rank), dtype, starting_q(m, self.rank, self.seed, index),
                     "powersgd_q")
            error = tf.Variable(tf.zeros([n, m], dtype), trainable=False, name="powersgd_error")
            matrices[key] = _Matrix(index, shape, n, m, dtype, q, error)
        self._matrices = matrices
        if optimizer is not None:
            self._owner = weakref.ref(optimizer)
            _carried[optimizer] = self

    def replicated_variables(self) -> list:
        """The step counter and every ``Q`` (equal on every rank), in creation order."""
        if self._matrices is None:
            return []
        return [self._step] + [x.q for x in self._matrices.values()]

    def rank_local_variables(self) -> list[tf.Variable]:
        """Every error buffer ``E`` (this rank's own), in creation order."""
        return [] if self._matrices is None else [x.error for x in self._matrices.values()]

    # -- the exchange --------------------------------------------------------------------------

    def reduce(self, grads: Sequence[Any], variables: Optional[Sequence[Any]],
               plain: Callable[[list], list], communicator: comm.Communicator,
               name: str) -> list[Any]:
        """Return the dense entries of ``grads`` averaged (low-rank for matrices) and the state
        advanced one step; other entries (None, ``tf.IndexedSlices``) are returned as given.

        ``plain(tensors)`` averages a list of dense tensors uncompressed (the warm-up).
        ``variables`` are the gradients' sources (required the first time, to build the state).

        Collective: every rank of ``communicator`` must call this, in the same order, with
        matching gradients.

        Raises:
            CollectiveArgumentError: an integer gradient, or gradients that do not match the
                state built for them.
        """
        grads = list(grads)
        if variables is None:
            raise CollectiveArgumentError(
                "PowerSGD keeps state per variable: pass the gradients' variables "
                "(apply(grads, trainable_variables), or build the optimizer first)")
        variables = list(variables)
        if not self.built:
            self.build(variables)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        for i in dense:
            _check_floating(grads[i].dtype, getattr(variables[i], "path", f"gradient {i}"))
        assert self._matrices is not None
        keys = [variable_key(v) for v in variables]
        strangers = [i for i in dense if keys[i] not in self._matrices
                     and compresses(tuple(grads[i].shape), self.rank)]
        if strangers:
            raise CollectiveArgumentError(
                f"this {self!r} keeps state for other variables than "
                f"{getattr(variables[strangers[0]], 'path', strangers[0])} (built for "
                f"{len(self._matrices)} other matrices); give each optimizer or training loop "
                "its own Compression.powersgd(...)")
        compressed = [i for i in dense if keys[i] in self._matrices]
        for i in compressed:
            expected = self._matrices[keys[i]].shape
            if tuple(grads[i].shape) != expected:
                raise CollectiveArgumentError(
                    f"PowerSGD state of {getattr(variables[i], 'path', i)} is for shape "
                    f"{expected}, the gradient has {tuple(grads[i].shape)}")
        out = list(grads)
        tensors = [tf.convert_to_tensor(grads[i]) for i in dense]
        step = self._step

        def warm() -> list:
            return list(plain(tensors))

        def average(parts: list, label: str) -> list:
            return collectives.grouped_allreduce(parts, op=ReduceOp.Average,
                                                 name=f"{name}.powersgd.{label}",
                                                 process_set=communicator)

        def compress() -> list:
            return self._compressed(tensors, [keys[i] for i in dense], average, fused_kernels())

        if not compressed:
            reduced = warm()
        elif self.warmup_steps:
            reduced = tf.cond(step < self.warmup_steps, warm, compress)
            reduced = reduced if isinstance(reduced, (list, tuple)) else [reduced]
        else:
            reduced = compress()
        with tf.control_dependencies(list(reduced)):
            step.assign_add(1)
        for i, r in zip(dense, reduced):
            out[i] = r
        return out

    def compute_alone(self, grads: Sequence[Any], variables: Sequence[Any],
                      fused: bool = True) -> list:
        """Run one compressed step's arithmetic on this rank alone (P = M Q, orthonormalise,
        Q = M^T P, error update; the averages left out) and return the results; advances the
        state. For timing the compression's own cost (``python -m bench.overlap``); with
        ``fused=False`` TensorFlow's ops compute it even where the compiled kernels exist.
        Local."""
        variables = list(variables)
        if not self.built:
            self.build(variables)
        return self._compressed([tf.convert_to_tensor(g) for g in grads],
                                [variable_key(v) for v in variables], lambda parts, _: parts,
                                fused_kernels() if fused else None)

    def _compressed(self, tensors: list, keys: list,
                    average: Callable[[list, str], list], kernels: Any) -> list:
        """One compressed step over dense ``tensors``: ``average(parts, "p")`` averages the P's
        (with the uncompressed rest) in one fused allreduce, ``average(parts, "q")`` the Q's;
        ``kernels``: :func:`fused_kernels`' module, or None for TensorFlow's ops. Collective, as
        :meth:`reduce`, when ``average`` is."""
        assert self._matrices is not None
        picked = [(j, self._matrices[k]) for j, k in enumerate(keys) if k in self._matrices]
        rest = [j for j, k in enumerate(keys) if k not in self._matrices]
        ms, ps = [], []
        for j, x in picked:
            g = tf.cast(tensors[j], x.dtype)
            if kernels is not None:  # M = G + E and P = M Q in one pass
                m, p = kernels.hpcrep_powersgd_project(g, x.error, x.q)
            else:
                m = tf.reshape(g, [x.n, x.m]) + x.error
                p = tf.matmul(m, x.q)
            ms.append(m)
            ps.append(p)
        first = average(ps + [tensors[j] for j in rest], "p")
        out: list = [None] * len(tensors)
        for j, r in zip(rest, first[len(ps):]):
            out[j] = r
        p_hats = [tf.linalg.qr(p)[0] for p in first[:len(ps)]]
        if kernels is not None:
            qs = [kernels.hpcrep_powersgd_back(m, p) for m, p in zip(ms, p_hats)]
        else:
            qs = [tf.matmul(m, p, transpose_a=True) for m, p in zip(ms, p_hats)]
        q_hats = average(qs, "q")
        # A non-finite gradient on any rank (a loss-scale overflow) reaches every rank's Q's
        # through the averages: then every rank keeps its E and Q as they were, instead of
        # carrying inf/NaN into every later step, and the step's own result stays non-finite
        # (so a LossScaleOptimizer skips it everywhere).
        # A branch, not tf.where over E: the select read the old E and wrote a third matrix,
        # two of the passes over the gradients' bytes that bound PowerSGD on one core.
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(q)) for q in q_hats])
        if kernels is not None:  # G_hat = P Q^T and the new E = M - G_hat in one pass
            approxes, errors = zip(*[kernels.hpcrep_powersgd_approx(m, p, q)
                                     for m, p, q in zip(ms, p_hats, q_hats)])
        else:
            approxes = [tf.matmul(p, q, transpose_b=True) for p, q in zip(p_hats, q_hats)]
            errors = None

        def advance() -> tf.Tensor:
            for i, ((_, x), m, approx, q) in enumerate(zip(picked, ms, approxes, q_hats)):
                x.error.assign(m - approx if errors is None else errors[i])
                x.q.assign(q)
            return tf.constant(True)

        tf.cond(finite, advance, lambda: tf.constant(False))
        for (j, x), approx in zip(picked, approxes):
            out[j] = tf.reshape(tf.cast(approx, tensors[j].dtype), x.shape)
        return out

    # -- accounting ------------------------------------------------------------------------------

    def bytes_per_step(self, variables: Sequence[Any]) -> tuple[int, int]:
        """Return ``(sent, float32)``: bytes one rank contributes to the exchanges of one
        compressed step for ``variables``' gradients, and the float32 bytes of the gradients
        themselves. Local."""
        sent = full = 0
        for v in variables:
            shape = tuple(v.shape)
            count = int(np.prod(shape, dtype=np.int64))
            itemsize = tf.as_dtype(v.dtype).size
            full += 4 * count
            if compresses(shape, self.rank):  # low precision is compressed in float32
                n, m = matrix_shape(shape)
                sent += self.rank * (n + m) * max(itemsize, 4)
            else:
                sent += count * itemsize
        return sent, full


def fused_kernels() -> Any:
    """Return the compiled library's op module where the compiled path is active
    (:func:`hpcrep.tensorflow.native.active`), else None. Its ``hpcrep_powersgd_*`` ops make
    seven passes over the gradients' bytes where TensorFlow's own ops (the fallback, same
    arithmetic up to rounding) make about nine. Every rank must get the same answer, as for the
    allreduce path, or their applied gradients differ in rounding. Local."""
    from hpcrep.tensorflow import native  # noqa: PLC0415

    return native.ops() if native.active() else None


def _check_floating(dtype: tf.DType, what: Any) -> None:
    if not dtype.is_floating:
        raise CollectiveArgumentError(
            f"PowerSGD compresses floating-point gradients; {what} has dtype {dtype.name}. "
            "Use Compression.none (or fp16) for this optimizer, or make the variable floating")


def carried_by(optimizer: Any) -> Optional[PowerSGD]:
    """Return the :class:`PowerSGD` whose state ``optimizer`` carries (see
    :meth:`PowerSGD.build`), or None. Local."""
    if optimizer is None:
        return None
    try:
        return _carried.get(optimizer)
    except TypeError:  # not weak-referenceable: carries nothing
        return None


def rank_local_variables(optimizer: Any) -> list[tf.Variable]:
    """Return the per-rank state (PowerSGD's error buffers) that ``optimizer`` carries besides
    its ``variables``: checkpoints save every rank's copy. Local."""
    carried = carried_by(optimizer)
    return [] if carried is None else carried.rank_local_variables()


def is_stateful(compression: Any) -> bool:
    """Return True if ``compression`` reduces whole lists of gradients with state (PowerSGD)
    rather than transforming each tensor. Local."""
    return isinstance(compression, PowerSGD)

