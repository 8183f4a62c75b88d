"""ZeRO stage 1 benchmark: Adam on ResNet-50 with the optimizer state sharded across ranks or not.

``python -m bench.zero --ranks 1,2,4 [--image-size 32 --batch 4 --rounds 3 --steps 2]`` runs, at
each rank count:

- one MPI job timing the same ``tf.function`` training step (ResNet-50 from ``jobs/resnet``,
  Adam) with ``hvd.DistributedOptimizer(Adam)`` (``plain``: allreduce, full slots) and with
  ``shard_optimizer_state=True`` (``zero``: reduce-scatter, 1/N of the slots, allgather) over
  the same model, the two taking turns in interleaved rounds (``bench.timing.time_rounds``:
  each figure is the median over rounds of the slowest rank's step), and reporting each
  variant's per-rank bytes of parameters and of optimizer slots
  (``hpcrep.tensorflow.zero.state_bytes``);
- two more jobs, one per variant alone, that build it and run two steps, for the peak resident
  memory (``ru_maxrss``) of the largest rank: a job holding both variants would count both.

Prints one table and writes ``--out DIR/zero.json`` when asked. Every rank runs
``HPCREP_THREADS`` TensorFlow threads (default 1 here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Any, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("plain", "zero")


def _steps(args: argparse.Namespace, names: Sequence[str]) -> tuple[dict, dict]:
    """Build ResNet-50 and one compiled Adam step per variant over it; return the steps and each
    variant's ``state_bytes``. Collective."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from hpcrep.tensorflow import zero  # noqa: PLC0415
    from jobs.resnet.model import resnet50  # noqa: PLC0415

    keras.utils.set_random_seed(1)
    model = resnet50(args.image_size)
    rng = np.random.default_rng(hvd.rank())
    images = tf.constant(rng.normal(size=(args.batch, args.image_size, args.image_size, 3))
                         .astype("float32"))
    labels = tf.constant(rng.integers(0, 1000, size=args.batch))
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    variables = model.trainable_variables
    steps, sizes = {}, {}
    for name in names:
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-4),
                                       shard_optimizer_state=name == "zero")
        opt.build(variables)

        @tf.function(jit_compile=False)
        def step(opt: Any = opt) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            opt.apply(tape.gradient(loss, variables), variables)
            return loss

        steps[name] = step
        sizes[name] = zero.state_bytes(opt)
    return steps, sizes


def worker(args: argparse.Namespace) -> None:
    """One MPI job: time both variants (``--only`` none) or run one for its memory. Collective."""
    import hpcrep.comm as hc  # noqa: PLC0415
    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.timing import time_rounds  # noqa: PLC0415

    hvd.init()
    names = [args.only] if args.only else list(VARIANTS)
    steps, sizes = _steps(args, names)
    result: dict[str, Any] = {"ranks": hc.size(), "bytes": hc.allgather_object(sizes)}
    if args.only:
        for _ in range(2):
            steps[args.only]()
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result["peak_rss_mib"] = max(hc.allgather_object(rss_kib)) / 1024
    else:
        result["timing"] = time_rounds(steps, args.rounds, args.steps,
                                       items_per_step=args.batch * hc.size())
    if hc.rank() == 0:
        with open(args.result, "w") as f:
            json.dump(result, f)


def _job(n: int, args: argparse.Namespace, only: Optional[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    command = [sys.executable, "-m", "bench.zero", "--worker", "--result", path,
               "--image-size", str(args.image_size), "--batch", str(args.batch),
               "--rounds", str(args.rounds), "--steps", str(args.steps)]
    if only:
        command += ["--only", only]
    env = {**os.environ, "HPCREP_THREADS": os.environ.get("HPCREP_THREADS", "1"),
           "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, "-m", "hpcrep.launch.mpirun", "-n", str(n), "--", *command],
                   env=env, check=True, cwd=ROOT, timeout=3600)
    with open(path) as f:
        out = json.load(f)
    os.unlink(path)
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def table(results: dict[int, dict]) -> str:
    """Markdown table of :func:`main`'s results, one row per rank count and variant. Local."""
    lines = ["| ranks | variant | step ms (median [min, max] over rounds) | params MiB/rank | "
             "slots MiB/rank (max) | shard MiB/rank | peak RSS MiB (max rank) |",
             "|---|---|---|---|---|---|---|"]
    for n, r in sorted(results.items()):
        for name in VARIANTS:
            t = r["timing"][name]
            per_rank = [b[name] for b in r["timing_bytes"]]
            lines.append(
                f"| {n} | {name} | {t['step_ms']:.0f} [{t['step_ms_min']:.0f}, "
                f"{t['step_ms_max']:.0f}] | {_mib(per_rank[0]['params'])} | "
                f"{_mib(max(b['slots'] for b in per_rank))} | "
                f"{_mib(max(b['shard'] for b in per_rank))} | {r['rss'][name]:.0f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zero", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4, help="images per rank per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    parser.add_argument("--out", help="directory for zero.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    results: dict[int, dict] = {}
    for n in (int(x) for x in args.ranks.split(",")):
        timed = _job(n, args, None)
        results[n] = {"timing": timed["timing"], "timing_bytes": timed["bytes"],
                      "rss": {name: _job(n, args, name)["peak_rss_mib"] for name in VARIANTS}}
        print(table({n: results[n]}), flush=True)  # each rank count as it finishes
        if args.out:  # rewritten after each: a later job that fails keeps the earlier figures
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "zero.json"), "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
