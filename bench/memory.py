"""Models larger than one rank, in ``hpcrep bench``: what each rank holds when the model and the
optimizer state are sharded.

Two series of MPI jobs on this machine's local ranks, at the rank counts of the run:

- the tensor-parallel click model (``jobs/replicator_tensor_parallel.py``: a sharded embedding
  table and a column/row-parallel pair) at the largest rank count n, once per replica size k
  dividing n: parameter bytes per rank against the same model unsharded, peak resident memory
  per rank, median step time and the loss at the start and end;
- ZeRO stage 1 (:mod:`bench.zero`: Adam on ResNet-50, ``shard_optimizer_state`` against the plain
  ``DistributedOptimizer``) at every rank count: parameter and slot bytes per rank, peak resident
  memory of each variant in a job of its own, and the two step times side by side in one job.

:func:`run` returns ``report["memory"]``; :func:`markdown` renders its section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The click model's size: quick (make bench) and full. Rows of the table, steps.
TENSOR_PARALLEL = {True: ["--rows", "100000", "--steps", "40"],
                   False: ["--rows", "1000000", "--steps", "60"]}
# bench.zero's ResNet-50: image size, batch per rank, rounds, steps per round.
ZERO = {True: ["--image-size", "32", "--batch", "4", "--rounds", "3", "--steps", "2"],
        False: ["--image-size", "64", "--batch", "8", "--rounds", "5", "--steps", "3"]}


def run(ranks: list[int], out: str, quick: bool, errors: list, timeout: int,
        cores_per_rank: int = 1) -> dict:
    """Run both series (see the module) into ``out``, every rank with ``cores_per_rank``
    threads as the run's other jobs (:func:`bench.placement.thread_env`); record failures in
    ``errors``. Local."""
    result: dict[str, Any] = {"tensor_parallel": {}, "zero": None}
    n = max(ranks)
    for k in (d for d in range(1, n + 1) if n % d == 0):
        label = f"tensor-parallel click model x{n}, {k} rank(s) per replica"
        got = _tensor_parallel(n, k, quick, timeout, errors, label, cores_per_rank)
        if got is not None:
            result["tensor_parallel"][str(k)] = got
    label = f"ZeRO-1 (bench.zero) at ranks {','.join(map(str, ranks))}"
    print(f"bench: {label} ...", flush=True)
    start = time.time()
    zero_out = os.path.join(out, "zero")
    try:
        subprocess.run([sys.executable, "-m", "bench.zero", "--ranks", ",".join(map(str, ranks)),
                        "--out", zero_out, *ZERO[quick]], cwd=ROOT, check=True,
                       capture_output=True, text=True, timeout=timeout * (3 * len(ranks)),
                       env=_env(cores_per_rank))
        with open(os.path.join(zero_out, "zero.json")) as f:
            result["zero"] = json.load(f)
        print(f"bench: {label} done in {time.time() - start:.0f} s", flush=True)
    except (subprocess.SubprocessError, OSError) as exc:
        tail = "\n".join(((getattr(exc, "stderr", None) or str(exc)).strip()).splitlines()[-15:])
        errors.append(f"{label}: {tail}")
        print(f"bench: {label} FAILED\n{tail}", flush=True)
    return result


def _env(cores_per_rank: int) -> dict[str, str]:
    from bench.placement import thread_env  # noqa: PLC0415
    from hpcrep.launch.mpirun import mpirun_env  # noqa: PLC0415

    env = mpirun_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(thread_env(cores_per_rank))
    env["PYTHONPATH"] = ROOT
    return env


def _tensor_parallel(n: int, k: int, quick: bool, timeout: int, errors: list,
                     label: str, cores_per_rank: int) -> Optional[dict]:
    """One run of the click model; its printed JSON, or None (error recorded)."""
    from hpcrep.launch.mpirun import mpirun_command  # noqa: PLC0415

    command = mpirun_command(n, [sys.executable, os.path.join(ROOT, "jobs",
                                                              "replicator_tensor_parallel.py"),
                                 "--ranks-per-replica", str(k), *TENSOR_PARALLEL[quick]])
    print(f"bench: {label} ...", flush=True)
    start = time.time()
    try:
        proc = subprocess.run(command, env=_env(cores_per_rank), capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        errors.append(f"{label}: timed out after {timeout} s")
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        errors.append(f"{label}: exit {proc.returncode}\n{tail}")
        print(f"bench: {label} FAILED (exit {proc.returncode})\n{tail}", flush=True)
        return None
    print(f"bench: {label} done in {time.time() - start:.0f} s", flush=True)
    return json.loads(lines[-1])


def _mb(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 1e6:.1f}"


def markdown(memory: Optional[dict]) -> list[str]:
    """The report's section on ``report["memory"]`` (nothing without it)."""
    if not memory:
        return []
    lines = ["## Models larger than one rank", ""]
    tp = memory.get("tensor_parallel") or {}
    if tp:
        first = next(iter(tp.values()))
        lines += [f"The tensor-parallel click model (jobs/replicator_tensor_parallel.py) at "
                  f"{first['ranks']} ranks, as replicas of k ranks: each replica's ranks split "
                  "the embedding table's rows and the wide layer's units; the same model "
                  f"unsharded holds {_mb(first['parameter_bytes_unsharded'])} MB of parameters.",
                  "", "| k (ranks per replica) | replicas | parameters MB per rank | optimizer "
                  "slots MB per rank | peak RSS MB per rank (max) | median step ms | loss first "
                  "-> last |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for k, r in sorted(tp.items(), key=lambda kv: int(kv[0])):
            rss, slots = r.get("peak_rss_bytes_per_rank"), r.get("slot_bytes_per_rank")
            lines.append(f"| {k} | {r['replicas']} | {_mb(max(r['parameter_bytes_per_rank']))} | "
                         f"{_mb(max(slots)) if slots else '-'} | "
                         f"{_mb(max(rss)) if rss else '-'} | {r['median_step_s'] * 1e3:.1f} | "
                         f"{r['first_loss']:.3f} -> {r['last_loss']:.3f} |")
        lines.append("")
    zero = (memory.get("zero") or {}).get("results")
    if zero:
        from bench.zero import table  # noqa: PLC0415

        lines += ["ZeRO stage 1 (bench.zero): Adam on ResNet-50, `DistributedOptimizer` plain "
                  "and with `shard_optimizer_state=True`, timed side by side in one job per "
                  "rank count; peak RSS from a job of each variant alone.", "",
                  table({int(n): r for n, r in zero.items()}), ""]
    return lines
