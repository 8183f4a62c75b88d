"""What every benchmark job in ``jobs/`` shares: common options, timing the job's own training
step with each variant (:mod:`bench.variants`) swapped in underneath, and writing rank 0's
results as JSON for the harness.

Communication time is what a step costs above the same step without communication: a variant's
``comm_ms`` is its step time minus the ``nosync`` step time of the same job (never below 0), and
``compute_ms`` the rest of its step time (the ``nosync`` step time, or less for a step that ran
faster than it: noise). The step is one compiled function (gradients averaged
inside ``DistributedGradientTape.gradient`` or the optimizer's ``apply``, batch-norm statistics
inside the forward pass), so this counts every exchange the step makes, as the user's step
makes it. Without ``nosync`` among the modes the split is not reported (``None``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
from typing import Any, Callable, Optional, Sequence

import numpy as np

from bench.sync import MODES
from bench.timing import time_steps
from bench.variants import Variant, variant

# A step factory takes a variant and returns a step: a function that runs one training step of
# the job with that variant underneath (and returns 0.0: no communication time of its own).
StepFactory = Callable[[Variant], Callable[[], float]]


def add_bench_arguments(parser: argparse.ArgumentParser, extra_modes: Sequence[str] = ()) -> None:
    """Add ``--bench-json``, ``--modes``, ``--steps`` and ``--warmup`` to a job's parser."""
    group = parser.add_argument_group("benchmark mode (used by `hpcrep bench`)")
    group.add_argument("--bench-json", metavar="PATH",
                       help="time steps instead of training; rank 0 writes results to PATH")
    group.add_argument("--modes", default="hpcrep,nosync,mpi4py",
                       help=f"synchronisers to time, comma-separated: "
                            f"{', '.join(tuple(MODES) + tuple(extra_modes))}")
    group.add_argument("--steps", type=int, default=10, help="timed steps per mode")
    group.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per mode")


def parse_modes(text: str, allowed: Sequence[str]) -> list[str]:
    """Split ``text`` into modes, checking each against ``allowed``."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in allowed]
    if bad or not modes:
        raise SystemExit(f"--modes: unknown {bad or text!r}; choose from {', '.join(allowed)}")
    return modes


def run_modes(factory: StepFactory, modes: Sequence[str], steps: int, warmup: int,
              items_per_step: float) -> dict[str, dict]:
    """Time ``steps`` steps of the job under each variant in ``modes``; split each step into
    communication and compute against ``nosync`` (see the module docstring).

    Collective: every rank must call this with the same arguments.
    """
    results = {}
    for mode in modes:
        step = factory(variant(mode))
        results[mode] = time_steps(step, steps, warmup, items_per_step)
    return split_communication(results)


def split_communication(results: dict[str, dict]) -> dict[str, dict]:
    """Set ``comm_ms``, ``compute_ms`` and ``comm_fraction`` of every mode from its step time and
    the ``nosync`` step time (all ``None`` without a ``nosync`` run). Returns ``results``."""
    base = results.get("nosync", {}).get("step_ms")
    for r in results.values():
        if base is None:
            r["comm_ms"] = r["compute_ms"] = r["comm_fraction"] = None
            continue
        comm = max(r["step_ms"] - base, 0.0)
        r["comm_ms"], r["compute_ms"] = comm, r["step_ms"] - comm  # their sum is the step
        r["comm_fraction"] = comm / r["step_ms"] if r["step_ms"] > 0 else 0.0
    return results


def environment() -> dict[str, Any]:
    """Versions and placement facts recorded with every job's results."""
    import tensorflow as tf  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    return {"ranks": MPI.COMM_WORLD.Get_size(), "tf_intra_threads":
            tf.config.threading.get_intra_op_parallelism_threads(),
            "tf": tf.__version__, "python": platform.python_version(),
            "mpi": MPI.Get_library_version().splitlines()[0]}


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
