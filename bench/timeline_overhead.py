"""What the timeline costs, and what it shows: ResNet-50 steps with the timeline on and off,
interleaved in one MPI job, and two traces for ``hpcrep analyze`` (overlap on and off).

``python -m hpcrep.launch.mpirun -n 2 -- python -m bench.timeline_overhead --out DIR`` (from the
checkout's root) times the same ``tf.function`` training step (ResNet-50, ``--image-size`` 64,
``--batch`` 16 per rank, ``hvd.DistributedOptimizer``) in ``--rounds`` rounds of ``--steps``
steps, the timeline on (``hvd.start_timeline`` before the round, ``stop_timeline`` after it,
outside the timed part) and off taking turns (:func:`bench.timing.interleaved_order`). The "on"
step is traced while the timeline records, so it carries the step marks; the "off" step is
traced with it off, so it carries nothing. Each figure is the median over rounds of the slowest
rank's mean step time. Then it records ``DIR/overlap_on.json`` and ``DIR/overlap_off.json``
(``HPCREP_OVERLAP=0`` when that step traced) over ``--trace-steps`` steps, for
``hpcrep analyze DIR/overlap_on.json --against DIR/overlap_off.json``. Prints one JSON line
(rank 0) and writes it to ``DIR/timeline_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable, Optional, Sequence


def _step_factory(model: Any, images: Any, labels: Any, opt: Any) -> Callable[[], Any]:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    def make() -> Callable[[], Any]:
        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            opt.apply(tape.gradient(loss, variables), variables)
            return loss
        return step
    return make


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--trace-steps", type=int, default=5)
    args = parser.parse_args(argv)

    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.allreduce import with_env  # noqa: PLC0415
    from bench.timing import interleaved_order  # noqa: PLC0415
    from hpcrep import comm as hcomm  # noqa: PLC0415
    from hpcrep.tensorflow import native  # noqa: PLC0415

    hvd.init()
    comm = hcomm.comm()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(hvd.rank())
    size = args.image_size
    images = tf.constant(rng.random((args.batch, size, size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, args.batch), tf.int64)
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3),
                                        classifier_activation=None)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.001))
    opt.build(model.trainable_variables)
    make = _step_factory(model, images, labels, opt)
    steps = {"off": make()}
    steps["off"]().numpy()  # traced with the timeline off: no marks in it
    scratch = os.path.join(args.out, "warm.json")
    hvd.start_timeline(scratch)
    steps["on"] = make()
    steps["on"]().numpy()  # traced while it records: carries the step marks
    no_overlap = with_env("HPCREP_OVERLAP", "0", make())
    no_overlap().numpy()
    hvd.stop_timeline()
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r, names in enumerate(interleaved_order(["on", "off"], args.rounds)):
        for name in names:
            if name == "on":
                hvd.start_timeline(os.path.join(args.out, f"round{r}.json"))
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = steps[name]()
            loss.numpy()
            elapsed = (time.perf_counter() - start) / args.steps
            comm.Barrier()
            if name == "on":
                hvd.stop_timeline()
            times[name].append(max(comm.allgather(elapsed)))
    for name, fn in (("overlap_on", steps["on"]), ("overlap_off", no_overlap)):
        hvd.start_timeline(os.path.join(args.out, f"{name}.json"))
        for _ in range(args.trace_steps):
            loss = fn()
        loss.numpy()
        hvd.stop_timeline()
    result = {"step_ms": {k: float(np.median(v)) * 1e3 for k, v in times.items()},
              "all_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
              "ranks": hvd.size(), "native": native.status()[1], "image_size": size,
              "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
              "threads": tf.config.threading.get_intra_op_parallelism_threads()}
    result["overhead"] = result["step_ms"]["on"] / result["step_ms"]["off"] - 1
    if hvd.rank() == 0:
        print(json.dumps(result), flush=True)
        with open(os.path.join(args.out, "timeline_overhead.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
