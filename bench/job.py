"""What every benchmark job in ``jobs/`` shares: common options, timing the job's own training
step with each variant (:mod:`bench.variants`) swapped in underneath, interleaved over repeated
rounds (:func:`bench.timing.time_rounds`), self-checks of every variant
(:mod:`bench.selfcheck`), and writing rank 0's results as JSON for the harness.

Communication time is what a step costs above the same step without communication: a variant's
``comm_ms`` is its step time minus the ``nosync`` step time of the same job (never below 0), and
``compute_ms`` the rest of its step time (the ``nosync`` step time, or less for a step that ran
faster than it: noise). The step is one compiled function (gradients averaged
inside ``DistributedGradientTape.gradient`` or the optimizer's ``apply``), so this counts every
exchange the step makes, as the user's step makes it. Without ``nosync`` among the modes the
split is not reported (``None``). ``vs_nosync`` is the variant's throughput over ``nosync``'s,
round by round (median and min-max over rounds): the figure machine contention cancels out of.
Given a trace file, hpcrep's variant then runs a few more steps with the timeline on, and its
results gain ``trace`` (:mod:`bench.exposed`): the exposed communication and overlap fraction
that the subtraction cannot give.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
from typing import Any, Callable, Optional, Sequence

import numpy as np

from bench import exposed, selfcheck
from bench import modes as bench_modes
from bench.sync import MODES
from bench.timing import spread, time_rounds
from bench.variants import Variant, variant


@dataclasses.dataclass
class Timed:
    """One variant's training step and what its self-checks need.

    Attributes:
        step: runs one training step of the job with the variant underneath.
        state: every variable ranks must agree on before a step (weights, optimizer slots), for
            the weights check to broadcast from rank 0.
        weights: the trainable weights whose digests are compared after one step.
        probe: ``"tape"`` (the variant's ``DistributedGradientTape`` averages the step's
            gradients) or ``"optimizer"`` (its ``DistributedOptimizer`` does).
    """

    step: Callable[[], object]
    state: Callable[[], Sequence[Any]]
    weights: Callable[[], Sequence[Any]]
    probe: str = "tape"


# A step factory takes a variant and returns its Timed step.
StepFactory = Callable[[Variant], Timed]


def add_bench_arguments(parser: argparse.ArgumentParser, extra_modes: Sequence[str] = ()) -> None:
    """Add ``--bench-json``, ``--modes``, ``--rounds`` and ``--steps`` to a job's parser."""
    group = parser.add_argument_group("benchmark mode (used by `hpcrep bench`)")
    group.add_argument("--bench-json", metavar="PATH",
                       help="time steps instead of training; rank 0 writes results to PATH")
    group.add_argument("--modes", default="hpcrep,nosync,mpi4py",
                       help=f"synchronisers to time, comma-separated: "
                            f"{', '.join(tuple(MODES) + tuple(extra_modes))}, and hpcrep's "
                            f"{bench_modes.POWERSGD_PREFIX}R (R >= 1), {bench_modes.AUTOTUNE}")
    group.add_argument("--rounds", type=int, default=5,
                       help="rounds; every mode runs --steps steps in each (interleaved)")
    group.add_argument("--steps", type=int, default=3, help="timed steps per mode per round")


def parse_modes(text: str, allowed: Sequence[str]) -> list[str]:
    """Split ``text`` into modes, checking each against ``allowed`` and the extra hpcrep
    variants of :mod:`bench.modes` (``hpcrep_powersgdR``, ``hpcrep_autotune``)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in allowed and not bench_modes.is_extra(m)]
    if bad or not modes:
        raise SystemExit(f"--modes: unknown {bad or text!r}; choose from {', '.join(allowed)}, "
                         f"{', '.join(bench_modes.EXAMPLES)} ({bench_modes.POWERSGD_PREFIX}R "
                         "for any rank R >= 1)")
    return modes


def run_modes(factory: StepFactory, modes: Sequence[str], rounds: int, steps: int,
              items_per_step: float, trace_file: Optional[str] = None) -> dict[str, dict]:
    """Check and time the job's step under each variant in ``modes``.

    Each variant's averaged probe gradient is checked first (:mod:`bench.selfcheck`, against
    the exact mean and hpcrep's); then all are warmed up and timed interleaved over ``rounds``
    rounds of ``steps`` steps (:func:`bench.timing.time_rounds`); then each one's weights are
    checked after one step from rank 0's state. A variant that fails a check keeps its
    ``check`` but loses its figures (``failed`` True): it is not reported as timed. With
    ``trace_file`` (and more than one rank), hpcrep's variant is then traced
    (:func:`bench.exposed.traced_figures`) and its results carry ``trace``.

    Collective: every rank must call this with the same arguments.
    """
    from mpi4py import MPI  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    variants = {mode: variant(mode) for mode in modes}
    timed = {mode: factory(v) for mode, v in variants.items()}
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    shapes = [tuple(w.shape) for w in timed[modes[0]].weights()]
    checks = gradient_checks(variants, timed[modes[0]].probe, shapes, rank, size)
    tuned = None
    if bench_modes.AUTOTUNE in timed:  # alone, before the others' steps can enter its timing
        from bench.overlap import settle_autotune  # noqa: PLC0415

        tuned = settle_autotune(timed[bench_modes.AUTOTUNE].step) or NO_TUNER
    results = time_rounds({m: t.step for m, t in timed.items()}, rounds, steps, items_per_step)
    if tuned is not None and rank == 0:
        results[bench_modes.AUTOTUNE]["autotune"] = tuned
    for mode, t in timed.items():
        checks[mode]["weights"] = selfcheck.check_weights(
            lambda t=t: hvd.broadcast_variables(list(t.state()), root_rank=0), t.step,
            t.weights, mode != "nosync")
    if trace_file and "hpcrep" in timed and size > 1:
        results["hpcrep"]["trace"] = exposed.traced_figures(timed["hpcrep"].step, trace_file)
    for mode, r in results.items():
        r["check"] = checks[mode]
        r["check"]["ok"] = all(c["ok"] for c in checks[mode].values() if isinstance(c, dict))
    return split_communication(results)


# hpcrep_autotune's settlement where no tuner ran (bench.overlap.settle_autotune gave None).
NO_TUNER = {"settled": None, "detail": "no tuner ran: one rank exchanges nothing (or the "
            "compiled path is off, which HPCREP_AUTOTUNE tunes)"}


def gradient_checks(variants: dict[str, Variant], route: str, shapes: Sequence[tuple],
                    rank: int, size: int) -> dict[str, dict]:
    """The gradient check of every variant (:mod:`bench.selfcheck`): mode -> {"gradient": ...}.

    Uncompressed variants average the full-rank probe, compared with the exact mean and with
    hpcrep's within the float32 bound. Each PowerSGD rank R among the variants gets the low-rank
    probe and PowerSGD's bound instead, compared with the exact mean and with hpcrep's average
    of the same probe; nosync also takes each low-rank probe (``powersgdR_probe``), which it
    must fail, as it must the full-rank one. The probe goes through each variant's tape or
    optimizer wrapper (``route``: :attr:`Timed.probe`).

    Collective: every rank must call this with the same variants and shapes.
    """
    probes = {None: selfcheck.probe_coefficients(shapes, rank)}
    for r in sorted({v.compression_rank for v in variants.values() if v.compression_rank}):
        probes[r] = selfcheck.low_rank_probe_coefficients(shapes, rank, r,
                                                          bench_modes.POWERSGD_SEED)
    hpcrep = variants.get("hpcrep") or variant("hpcrep")
    checks: dict[str, dict] = {mode: {} for mode in variants}
    for r, coefficients in probes.items():
        mean, tolerance = selfcheck.exact_mean_and_tolerance(coefficients)
        bound = "the float32 bound"
        if r is not None:
            tolerance = selfcheck.compressed_tolerances(mean, tolerance, r,
                                                        bench_modes.POWERSGD_SEED)
            bound = f"PowerSGD rank {r}'s bound"
        reference = _probe(hpcrep, route, coefficients)
        for mode, v in variants.items():
            if v.compression_rank == r:
                key = "gradient"
            elif mode == "nosync":
                key = f"powersgd{r}_probe"
            else:
                continue
            result = reference if mode == "hpcrep" else _probe(v, route, coefficients)
            checks[mode][key] = selfcheck.gradient_verdict(
                result, mean, tolerance, mode != "nosync", size,
                None if mode == "hpcrep" else reference, bound)
        del mean, tolerance, reference
    return checks


def _probe(v: Variant, route: str, coefficients: list) -> list:
    """The averaged probe gradient through ``v``'s tape or optimizer wrapper. Collective."""
    if route == "optimizer":
        return selfcheck.optimizer_probe(v.DistributedOptimizer, coefficients)
    return selfcheck.tape_probe(v.DistributedGradientTape, coefficients)


def split_communication(results: dict[str, dict]) -> dict[str, dict]:
    """Set ``comm_ms``, ``compute_ms``, ``comm_fraction`` and ``vs_nosync`` (throughput over
    nosync's: median, min and max over rounds of the per-round ratio) of every mode from its
    step times and nosync's (all ``None`` without a ``nosync`` run); then withhold the figures
    of every mode whose self-check failed (``failed`` True). Returns ``results``."""
    base_run = results.get("nosync", {})
    base = base_run.get("step_ms")
    for r in results.values():
        if base is None:
            r["comm_ms"] = r["compute_ms"] = r["comm_fraction"] = r["vs_nosync"] = None
            continue
        comm = max(r["step_ms"] - base, 0.0)
        r["comm_ms"], r["compute_ms"] = comm, r["step_ms"] - comm  # their sum is the step
        r["comm_fraction"] = comm / r["step_ms"] if r["step_ms"] > 0 else 0.0
        r["vs_nosync"] = round_ratio(base_run.get("round_ms") or [base],
                                     r.get("round_ms") or [r["step_ms"]])
    for r in results.values():
        if not r.get("check", {}).get("ok", True):
            r["failed"] = True
            for key in ("step_ms", "step_ms_min", "step_ms_max", "throughput", "throughput_min",
                        "throughput_max", "comm_ms", "compute_ms", "comm_fraction",
                        "vs_nosync", "trace"):
                r[key] = None
    return results


def round_ratio(base_ms: Sequence[float], ms: Sequence[float]) -> dict[str, float]:
    """Throughput of a variant over a base variant timed in the same rounds: ``base / ms`` per
    round, as :func:`bench.timing.spread` (median, min, max). Local."""
    if len(base_ms) != len(ms) or not ms:
        raise ValueError(f"need the same rounds for both, got {len(base_ms)} and {len(ms)}")
    return spread([b / t for b, t in zip(base_ms, ms)])


def environment() -> dict[str, Any]:
    """Versions and placement facts recorded with every job's results."""
    import tensorflow as tf  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    from hpcrep.comm import mpi_library_version  # noqa: PLC0415

    return {"ranks": MPI.COMM_WORLD.Get_size(), "tf_intra_threads":
            tf.config.threading.get_intra_op_parallelism_threads(),
            "tf": tf.__version__, "python": platform.python_version(),
            "mpi": mpi_library_version()}


def gradient_summary(variables: Sequence[Any]) -> dict[str, int]:
    """Return what one gradient exchange of ``variables`` moves: bytes (fp32) and tensor count."""
    return {"grad_bytes": sum(int(np.prod(v.shape)) * 4 for v in variables),
            "grad_tensors": len(variables)}


def write_result(path: Optional[str], result: dict) -> None:
    """Rank 0 writes ``result`` (plus the environment) to ``path`` as JSON; others do nothing."""
    from mpi4py import MPI  # noqa: PLC0415

    if not path or MPI.COMM_WORLD.Get_rank() != 0:
        return
    result = dict(result, environment=environment())
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, path)


def weights_agree(variables: Sequence[Any]) -> bool:
    """True if every rank holds exactly the same ``variables``: dtype, shape and every byte.

    Compares a SHA-256 digest of each rank's variables, so a difference in one element's last
    bit counts (per-variable sums would miss elements that differ but add up alike).

    Collective: every rank must call this.
    """
    from hpcrep import comm  # noqa: PLC0415

    digest = hashlib.sha256()
    for v in variables:
        a = np.ascontiguousarray(np.asarray(v))
        digest.update(f"{a.dtype.str}{a.shape};".encode())
        digest.update(a.tobytes())
    everyone = comm.allgather_object(digest.hexdigest())
    return all(d == everyone[0] for d in everyone)
