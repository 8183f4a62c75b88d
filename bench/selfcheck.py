"""Self-checks of a benchmark variant: did it really average?

Two checks per variant, run inside the benchmark job (``bench.job.run_modes``):

- **weights**: every rank starts from rank 0's state (weights and optimizer slots broadcast),
  runs one training step of the variant, and the SHA-256 digests of all its trainable weights'
  bytes are compared across ranks. An averaging variant must leave them identical; ``nosync``
  must leave them different at more than one rank (the ranks see different data), which shows
  the check can fail.
- **gradient**: a probe whose gradient is known: trainable variables shaped like the model's,
  and a loss ``sum(v * c_rank)`` with a different random ``c_rank`` on each rank, so that the
  gradient is exactly ``c_rank`` and the averaged gradient ``mean_r c_r``. The variant's
  averaged probe gradient (through the same tape or optimizer wrapper the step uses) is compared
  with that mean (summed in float64) and with hpcrep's own averaged probe gradient. The tolerance
  is what float32 arithmetic allows: averaging ``n`` values with ``n - 1`` additions and one
  scaling by ``1/n`` (before or after the sum) errs by at most ``(n + 1) u sum_r |c_r| / n``
  per element, ``u = 2**-24``; the check allows ``(n + 2) u sum_r |c_r| / n`` against the mean
  and twice that against hpcrep's.

A compressing variant (``hpcrep_powersgdR``, PowerSGD of rank ``R``) does not average a
full-rank probe exactly, so its **gradient** check uses a probe it can average exactly and a
bound for PowerSGD's own rounding:

- *The probe* (:func:`low_rank_probe_coefficients`): every matrix that PowerSGD compresses
  (as PowerSGD sees it, ``[n, m]``) gets ``c_r = U_r V^T`` with ``U_r`` (``[n, R]``) standard
  normal and seeded by the rank, and ``V`` (``[m, R]``) the same on every rank: PowerSGD's own
  starting ``Q`` of that matrix (``hpcrep.tensorflow.powersgd.starting_q``, the benchmark's
  seed) times ``sqrt(m / R)``. Their mean ``A = mean_r(U_r) V^T`` has rank ``R``, which PowerSGD
  reconstructs exactly in exact arithmetic (``hpcrep/tensorflow/powersgd.py``: the result is
  ``P P^T A`` with ``P`` an orthonormal basis of ``A Q``). Vectors and the matrices PowerSGD
  sends uncompressed keep the full-rank probe and the float32 bound above. Without averaging
  the result is this rank's own ``c_r`` (nosync) or, averaging only one factor, its projection:
  both off by about ``|c_r - A|``, of the order of the entries themselves.
- *The bound* (:func:`powersgd_tolerance`), per element of a compressed matrix: the float32
  bound of the average plus ``8 u kappa ||A||_F`` with ``kappa = ||A||_2 / sigma_R(A Q)``.
  Why: with zero error buffers (the probe's one step) PowerSGD returns ``P P^T A``, ``P``
  spanning the computed ``A Q + delta``. Rounding (the float32 products ``A Q``, ``A^T P`` and
  ``P Q^T``, the averages, the QR, which is backward stable) leaves ``||delta||`` a small
  multiple of ``u ||A||_F`` (``Q`` and ``P`` have orthonormal columns; dot products of ``m``
  terms err like ``sqrt(m) u``, far below the worst case ``m u``), and a perturbation
  ``delta`` turns the spanned subspace by ``sin theta <= ||delta|| / sigma_R(A Q)`` (Wedin), so
  the projection misses ``A`` by at most ``sin theta ||A||_2 = kappa ||delta||``. Measured on
  ResNet-50's compressed matrices (rank 2, with a random ``V`` for ``kappa`` up to 2,470): at
  most ``0.21 u kappa ||A||_F``; the factor 8 leaves a margin of about 40. With ``V`` built from
  the starting ``Q``, ``A Q = sqrt(m / R) mean_r(U_r)`` and ``kappa`` is the condition number of
  the mean of Gaussian ``[n, R]`` matrices (near 1 for ``n >> R``), so the bound stays about
  ``1e-6 ||A||_F``: for ResNet-50's largest matrix (``||A||_F`` about 1,500) under ``1e-2``,
  against errors of order 1 without averaging.

The comparisons are pure functions (:func:`digests_agree`, :func:`average_tolerance`,
:func:`powersgd_tolerance`, :func:`gradient_verdict`); the rest is collective.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

UNIT_ROUNDOFF = 2.0 ** -24  # float32
PROBE_SEED = 1234


def weights_digest(variables: Sequence[Any]) -> str:
    """SHA-256 of the bytes of every variable in ``variables``, in order. Local."""
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(np.asarray(v)).tobytes())
    return h.hexdigest()


def digests_agree(digests: Sequence[str]) -> bool:
    """True if every rank's digest is the same. Local."""
    return len(set(digests)) == 1


def weights_verdict(digests: Sequence[str], averages: bool) -> dict:
    """The weights check's outcome for one variant, from every rank's digest.

    ``averages``: whether the variant should average (False for ``nosync``). With one rank the
    check cannot tell (``ok`` True, ``informative`` False). Local.
    """
    agree, ranks = digests_agree(digests), len(digests)
    if ranks == 1:
        return {"ok": True, "informative": False, "agree": agree,
                "detail": "one rank: nothing to compare"}
    if averages:
        return {"ok": agree, "informative": True, "agree": agree,
                "detail": "weights identical on every rank after one step" if agree else
                f"weights differ across ranks after one step ({len(set(digests))} distinct "
                f"digests over {ranks} ranks): the variant did not average"}
    return {"ok": not agree, "informative": True, "agree": agree,
            "detail": "weights differ across ranks after one step, as they must without "
            "averaging" if not agree else "weights identical without averaging: the check "
            "cannot see a missing exchange (do the ranks get different data?)"}


def average_tolerance(abs_sum: np.ndarray, ranks: int) -> np.ndarray:
    """Per-element bound on a float32 average's rounding error: ``(n + 2) u sum|c| / n`` (see
    the module docstring), plus the smallest normal float32 for values near zero. Local."""
    return ((ranks + 2) * UNIT_ROUNDOFF * np.asarray(abs_sum, np.float64) / ranks
            + np.finfo(np.float32).tiny)


def gradient_verdict(result: Sequence[np.ndarray], exact_mean: Sequence[np.ndarray],
                     tolerance: Sequence[np.ndarray], averages: bool, ranks: int,
                     reference: Optional[Sequence[np.ndarray]] = None,
                     bound: str = "the float32 bound") -> dict:
    """The gradient check's outcome for one variant.

    ``result``: its averaged probe gradient; ``exact_mean``: the float64 mean of every rank's
    probe gradient; ``tolerance``: :func:`average_tolerance` (or :func:`compressed_tolerances`,
    with ``bound`` naming it in the detail); ``reference``: hpcrep's averaged probe gradient
    (None: not compared). ``worst`` is the largest error over its tolerance (at
    most 1 passes). A non-averaging variant (``averages`` False) passes when its result is *not*
    the mean at more than one rank. Local.
    """
    worst = max((float(np.max(np.abs(np.asarray(r, np.float64) - m) / t))
                 for r, m, t in zip(result, exact_mean, tolerance) if np.size(m)), default=0.0)
    out = {"worst_over_tolerance": worst}
    if reference is not None:
        out["worst_vs_hpcrep_over_tolerance"] = max(
            (float(np.max(np.abs(np.asarray(r, np.float64) - np.asarray(h, np.float64))
                          / (2 * t)))
             for r, h, t in zip(result, reference, tolerance) if np.size(t)), default=0.0)
    averaged = worst <= 1.0 and out.get("worst_vs_hpcrep_over_tolerance", 0.0) <= 1.0
    if averages:
        out["ok"] = averaged
        out["detail"] = (f"averaged gradient within {bound} of the exact mean"
                         + (" and of hpcrep's" if reference is not None else "")
                         if averaged else f"averaged gradient off by {worst:.3g}x {bound} of "
                         "the exact mean"
                         + (f" ({out['worst_vs_hpcrep_over_tolerance']:.3g}x against hpcrep's)"
                            if reference is not None else ""))
    elif ranks == 1:
        out["ok"], out["detail"] = True, "one rank: not averaged, nothing to compare"
    else:
        out["ok"] = worst > 1.0
        out["detail"] = ("not averaged, as expected (its own gradient, far from the mean)"
                         if out["ok"] else "equal to the mean without averaging: the probe "
                         "cannot see a missing exchange")
    return out


def probe_coefficients(shapes: Sequence[Sequence[int]], rank: int) -> list[np.ndarray]:
    """This rank's probe gradient: standard normal float32 of ``shapes``, seeded by the rank.
    Local."""
    rng = np.random.default_rng(PROBE_SEED + rank)
    return [rng.standard_normal(tuple(s), dtype=np.float32) for s in shapes]


# PowerSGD's rounding in units of u kappa ||A||_F (module docstring: measured at most 0.21).
POWERSGD_ROUNDING = 8.0


def compressed_positions(shapes: Sequence[Sequence[int]], compression_rank: int
                         ) -> dict[int, int]:
    """Which of ``shapes`` PowerSGD of ``compression_rank`` compresses: position -> the matrix's
    index among the compressed ones (its starting ``Q``'s index), in order. Local."""
    from hpcrep.tensorflow.powersgd import compresses  # noqa: PLC0415

    out: dict[int, int] = {}
    for i, shape in enumerate(shapes):
        if compresses(tuple(shape), compression_rank):
            out[i] = len(out)
    return out


def starting_factor(shape: Sequence[int], compression_rank: int, index: int,
                    seed: int) -> np.ndarray:
    """``V`` of the low-rank probe for the ``index``-th compressed matrix of ``shape``: PowerSGD's
    starting ``Q`` (``[m, R]``, orthonormal columns, float64) times ``sqrt(m / R)``, so that the
    probe's entries are of order 1. Local."""
    from hpcrep.tensorflow.powersgd import matrix_shape, starting_q  # noqa: PLC0415

    _, m = matrix_shape(tuple(shape))
    return starting_q(m, compression_rank, seed, index) * np.sqrt(m / compression_rank)


def low_rank_probe_coefficients(shapes: Sequence[Sequence[int]], rank: int,
                                compression_rank: int, seed: int) -> list[np.ndarray]:
    """This rank's probe gradient for a PowerSGD variant of ``compression_rank`` whose starting
    ``Q`` comes from ``seed`` (see the module docstring): ``U_rank V^T`` for every matrix it
    compresses, :func:`probe_coefficients`'s standard normal entries elsewhere; float32. Local.
    """
    from hpcrep.tensorflow.powersgd import matrix_shape  # noqa: PLC0415

    compressed = compressed_positions(shapes, compression_rank)
    rng = np.random.default_rng(PROBE_SEED + rank)
    out = []
    for i, shape in enumerate(shapes):
        shape = tuple(shape)
        if i not in compressed:
            out.append(rng.standard_normal(shape, dtype=np.float32))
            continue
        n, _ = matrix_shape(shape)
        u = rng.standard_normal((n, compression_rank))
        v = starting_factor(shape, compression_rank, compressed[i], seed)
        out.append((u @ v.T).astype(np.float32).reshape(shape))
    return out


def powersgd_tolerance(exact_mean: np.ndarray, tolerance: np.ndarray, q: np.ndarray
                       ) -> np.ndarray:
    """Per-element bound on PowerSGD's error for one compressed matrix whose exact mean over
    ranks is ``exact_mean`` (any shape; PowerSGD's ``[n, m]`` view is taken), given the float32
    average's bound ``tolerance`` and the starting ``Q`` (``[m, R]``): ``tolerance + 8 u kappa
    ||A||_F`` with ``kappa = ||A||_2 / sigma_R(A Q)`` (see the module docstring; infinite, so
    that nothing is claimed, if ``A Q`` has rank below R). Local."""
    from hpcrep.tensorflow.powersgd import matrix_shape  # noqa: PLC0415

    n, m = matrix_shape(np.shape(exact_mean))
    a = np.asarray(exact_mean, np.float64).reshape(n, m)
    singular = np.linalg.svd(a @ np.asarray(q, np.float64), compute_uv=False)
    norm2 = float(np.linalg.norm(a, 2))
    kappa = norm2 / singular[-1] if singular[-1] > 0 else np.inf
    return np.asarray(tolerance, np.float64) + (
        POWERSGD_ROUNDING * UNIT_ROUNDOFF * kappa * float(np.linalg.norm(a)))


def compressed_tolerances(exact_mean: Sequence[np.ndarray], tolerance: Sequence[np.ndarray],
                          compression_rank: int, seed: int) -> list[np.ndarray]:
    """``tolerance`` with :func:`powersgd_tolerance` in place of the float32 bound for every
    matrix that PowerSGD of ``compression_rank`` (starting ``Q`` from ``seed``) compresses. Local.
    """
    from hpcrep.tensorflow.powersgd import matrix_shape, starting_q  # noqa: PLC0415

    compressed = compressed_positions([np.shape(m) for m in exact_mean], compression_rank)
    out = list(tolerance)
    for i, index in compressed.items():
        _, m = matrix_shape(np.shape(exact_mean[i]))
        out[i] = powersgd_tolerance(exact_mean[i], tolerance[i],
                                    starting_q(m, compression_rank, seed, index))
    return out


def exact_mean_and_tolerance(coefficients: Sequence[np.ndarray]
                             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The float64 mean over ranks of ``coefficients`` and :func:`average_tolerance` for it.

    Collective: every rank must call this with arrays of the same shapes.
    """
    from mpi4py import MPI  # noqa: PLC0415

    world = MPI.COMM_WORLD
    n = world.Get_size()
    means, tols = [], []
    for c in coefficients:
        total = np.asarray(c, np.float64).copy()
        absolute = np.abs(total)
        world.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        world.Allreduce(MPI.IN_PLACE, absolute, op=MPI.SUM)
        means.append(total / n)
        tols.append(average_tolerance(absolute, n))
    return means, tols


def tape_probe(distributed_tape: Callable[[Any], Any],
               coefficients: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The averaged gradient of ``sum_i sum(v_i * c_i)`` (``c`` = ``coefficients``) with respect
    to fresh zero variables, through ``distributed_tape`` inside ``tf.function``.

    Collective when the tape communicates: every rank must call this, in the same order.
    """
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    variables = [keras.Variable(np.zeros_like(c)) for c in coefficients]
    consts = [tf.constant(c) for c in coefficients]

    @tf.function
    def gradient() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * c) for v, c in zip(variables, consts)])
        return distributed_tape(tape).gradient(loss, variables)

    return [np.asarray(tf.convert_to_tensor(g)) for g in gradient()]


def optimizer_probe(distributed_optimizer: Callable[[Any], Any],
                    coefficients: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The averaged gradient as an optimizer wrapper applies it: SGD (learning rate 1) wrapped
    by ``distributed_optimizer`` applies ``coefficients`` to zero variables inside
    ``tf.function``; the variables then hold minus the averaged gradient.

    Collective when the wrapper communicates: every rank must call this, in the same order.
    """
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    variables = [keras.Variable(np.zeros_like(c)) for c in coefficients]
    consts = [tf.constant(c) for c in coefficients]
    opt = distributed_optimizer(keras.optimizers.SGD(1.0))
    opt.build(variables)
    tf.function(lambda: opt.apply(consts, variables))()
    return [-np.asarray(v) for v in variables]


def check_weights(sync_state: Callable[[], None], step: Callable[[], object],
                  weights: Callable[[], Sequence[Any]], averages: bool) -> dict:
    """The weights check: ``sync_state()`` (rank 0's state to every rank), one ``step()``, then
    every rank's :func:`weights_digest` of ``weights()`` compared.

    Collective: every rank must call this, in the same order.
    """
    from mpi4py import MPI  # noqa: PLC0415

    sync_state()
    step()
    digests = MPI.COMM_WORLD.allgather(weights_digest(weights()))
    return weights_verdict(digests, averages)
