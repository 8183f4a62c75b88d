"""Replica canary cost: a ResNet-50 training step with the canary every step, at the default
interval, and off, side by side in one MPI job.

``python -m bench.replica_check [--ranks 2] [--out DIR]`` times the same compiled step
(``keras.applications.ResNet50(weights=None)``, ``--image-size`` 64, ``--batch`` 16 per rank,
``hvd.DistributedOptimizer(SGD)``) with ``HPCREP_CHECK_REPLICAS`` = 1 (the worst case), the
default, and 0, interleaved over rounds (:func:`bench.timing.time_rounds`), plus the check alone
(:func:`hpcrep.tensorflow.replica_check.check_replicas`'s common path on the same variables,
compiled). The amortised cost at the default is the check's own time over the interval, as a
percentage of the step without the canary. Writes ``DIR/replica_check.json`` and prints a
summary; every rank runs ``HPCREP_THREADS`` TensorFlow threads (default 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _steps(model: Any, images: Any, labels: Any, default: int) -> dict[str, Callable[[], Any]]:
    """One compiled step per variant (each with its own optimizer), and the check alone.
    Collective."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.allreduce import with_env  # noqa: PLC0415 - settings read when a step traces
    from hpcrep import comm  # noqa: PLC0415
    from hpcrep.tensorflow.replica_check import _common_path  # noqa: PLC0415

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    def optimizer_step() -> Callable[[], Any]:
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.001))
        opt.build(variables)

        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            opt.apply(tape.gradient(loss, variables), variables)
            return loss
        return step

    checked = list(variables) + list(model.non_trainable_variables)

    @tf.function
    def check_alone() -> Any:
        _, _, differs, bad = _common_path([tf.convert_to_tensor(v) for v in checked],
                                          comm.resolve(None))
        return tf.reduce_any(differs) | tf.reduce_any(bad)

    return {"canary_every_step": with_env("HPCREP_CHECK_REPLICAS", "1", optimizer_step()),
            f"canary_every_{default}": with_env("HPCREP_CHECK_REPLICAS", str(default),
                                                optimizer_step()),
            "canary_off": with_env("HPCREP_CHECK_REPLICAS", "0", optimizer_step()),
            "check_alone": check_alone}


def worker(image_size: int, batch: int, rounds: int, steps_per_round: int) -> dict:
    """Time every variant inside the MPI job; every rank returns the same figures. Collective."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.timing import time_rounds  # noqa: PLC0415
    from hpcrep import config  # noqa: PLC0415

    hvd.init()
    default = config.SETTINGS["HPCREP_CHECK_REPLICAS"].default
    rng = np.random.default_rng(hvd.rank())
    images = tf.constant(rng.random((batch, image_size, image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, batch), tf.int64)
    keras.utils.set_random_seed(1)
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                        classifier_activation=None)
    steps = _steps(model, images, labels, default)
    for fn in steps.values():  # trace
        np.asarray(fn())
    timed = time_rounds({k: (lambda f=f: np.asarray(f())) for k, f in steps.items()}, rounds,
                        steps_per_round, batch * hvd.size())
    off = timed["canary_off"]["step_ms"]
    check = timed["check_alone"]["step_ms"]
    return {"ranks": hvd.size(), "image_size": image_size, "batch": batch, "default": default,
            "threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "variables": len(model.trainable_variables) + len(model.non_trainable_variables),
            "figures": {k: {f: v[f] for f in ("step_ms", "step_ms_min", "step_ms_max",
                                                 "round_ms")} for k, v in timed.items()},
            "every_step_overhead_pct": 100 * (timed["canary_every_step"]["step_ms"] - off) / off,
            "amortised_pct_at_default": 100 * check / default / off}


def render(report: dict) -> str:
    """The report as text lines: each variant's step time median [min-max] and the costs."""
    lines = [f"Replica canary cost, ResNet-50 {report['image_size']}x{report['image_size']}, "
             f"batch {report['batch']} per rank, {report['ranks']} ranks, {report['threads']} "
             f"TensorFlow thread(s) per rank ({report['date']}, {report['machine']})"]
    for name, f in report["figures"].items():
        lines.append(f"  {name:<22} {f['step_ms']:8.1f} ms  [{f['step_ms_min']:.1f}-"
                     f"{f['step_ms_max']:.1f}]")
    lines.append(f"  canary every step costs {report['every_step_overhead_pct']:+.1f}% of a "
                 "step (measured difference, noise included)")
    lines.append(f"  amortised at HPCREP_CHECK_REPLICAS={report['default']}: the check alone "
                 f"({report['figures']['check_alone']['step_ms']:.1f} ms) / "
                 f"{report['default']} = {report['amortised_pct_at_default']:.3f}% of a step; "
                 "from the every-step difference instead: "
                 f"{report['every_step_overhead_pct'] / report['default']:.3f}%")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--out", help="report directory (default reports/replica-check-<time>)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(args.image_size, args.batch, args.rounds, args.steps_per_round)
        from hpcrep import comm  # noqa: PLC0415

        if comm.rank() == 0:
            with open(args.worker, "w") as f:
                json.dump(result, f)
        return 0
    out = args.out or os.path.join(
        ROOT, "reports", "replica-check-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, HPCREP_THREADS=os.environ.get("HPCREP_THREADS", "1"),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    fd, result_path = tempfile.mkstemp(suffix=".json", dir=out)
    os.close(fd)
    command = [sys.executable, "-m", "bench.replica_check", "--worker", result_path,
               "--image-size", str(args.image_size), "--batch", str(args.batch),
               "--rounds", str(args.rounds), "--steps-per-round", str(args.steps_per_round)]
    try:
        subprocess.run([sys.executable, "-m", "hpcrep.launch.mpirun", "-n", str(args.ranks),
                        "--", *command], env=env, check=True, cwd=ROOT, timeout=3600)
        with open(result_path) as f:
            report = json.load(f)
    finally:
        os.unlink(result_path)
    import platform  # noqa: PLC0415

    report.update(date=datetime.datetime.now().isoformat(timespec="seconds"),
                  machine=f"{platform.node()}, {os.cpu_count()} cores")
    with open(os.path.join(out, "replica_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(render(report))
    print(f"report: {out}/replica_check.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
