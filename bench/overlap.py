"""Overlap benchmark: a ResNet-50 training step with and without gradient exchange hidden behind
the backward pass, side by side in one MPI job.

``python -m bench.overlap --ranks 2 [--cluster-nodes 2 --link 2gbit] [--out DIR]`` times the same
``tf.function`` training step (ResNet-50, ``--image-size`` 64, ``--batch`` 16 per rank, SGD) under:

- ``nosync``: the plain optimizer, no communication (the upper bound);
- ``hpcrep``: ``hvd.DistributedOptimizer`` with the defaults (compiled path, overlap on);
- ``hpcrep_no_overlap``: the same with ``HPCREP_OVERLAP=0`` (one exchange after the backward pass);
- ``hpcrep_python``: the same with ``HPCREP_NATIVE=off`` (the Python path);
- ``hpcrep_fp16``: the defaults with ``compression=hvd.Compression.fp16`` (half the bytes on the
  wire, overlapped the same way);
- ``hpcrep_powersgd2``, ``hpcrep_powersgd4``: the defaults with
  ``compression=hvd.Compression.powersgd(rank=2 or 4)`` (PowerSGD, no warm-up: two fused
  allreduces of low-rank factors per step); the probes ``powersgd2_compute`` and
  ``powersgd4_compute`` time its arithmetic alone on the same gradients (P = M Q, orthonormalise,
  Q = M^T P, error update; no exchange), and the report gives the bytes each rank sends per step
  against float32;
- ``hpcrep_no_chunk``: the defaults with ``HPCREP_ALLREDUCE_CHUNK=0`` (each bucket in one
  ``MPI_Allreduce`` instead of pieces of at most 4 MiB);
- ``hpcrep_autotuned``: the defaults with ``HPCREP_AUTOTUNE=1``: before the timed repetitions
  it trains alone until the tuner has settled (the steps it took and the setting it chose are
  reported), then the tuner is frozen so that the other variants' steps never enter its
  measurements;
- ``horovod``: ``horovod.tensorflow.grouped_allreduce`` of the gradients (its
  ``DistributedGradientTape`` fails on Keras 3 variables), when ``make peers`` has built Horovod
  into ``.venv-peers``.

Horovod runs in a second MPI job of its own, with its own ``nosync``: once ``horovod.init()``
has run, its background thread slows every step in the process (the unsynchronised step took
903 ms there against 535 ms without it, on the test cluster), which would flatter every ratio.
In each job the variants take turns within each repetition; each figure is the median over
repetitions of the slowest rank's mean step time. Efficiency is the variant's throughput over
its own job's ``nosync``. Every rank runs ``HPCREP_THREADS`` TensorFlow threads (default 1).
Three probes are timed alongside, for the ceilings on efficiency the report gives: the forward
pass alone, and the exchange alone (float32 and float16). No exchange can start before the
backward pass does, so with a link cap a step takes at least the forward pass plus the exchange's
time on the wire (``bench.cluster.allreduce_lower_bound_ms``). And every variant's machine CPU
per step is measured (``bench.timing.machine_busy_seconds``): where the ranks leave no core to
spare, a step takes at least nosync's CPU plus the exchange's, over the cores.
Writes ``DIR/overlap.json`` and ``DIR/overlap.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _variants(model: Any, images: Any, labels: Any, group: str) -> dict[str, Callable[[], Any]]:
    """Build one compiled training step per variant of ``group`` (``"hpcrep"`` or
    ``"horovod"``, each with ``nosync``) over the same model. Collective."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    def optimizer_step(opt: Any) -> Callable[[], Any]:
        @tf.function
        def step() -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            opt.apply(tape.gradient(loss, variables), variables)
            return loss
        return step
    from bench.allreduce import with_env  # noqa: PLC0415 - settings read when a step traces

    out = {"nosync": optimizer_step(keras.optimizers.SGD(0.001))}
    if group == "horovod":
        out["horovod"] = _horovod_step(model, images, labels, loss_fn)
        return out
    out.update({
        "hpcrep": optimizer_step(hvd.DistributedOptimizer(keras.optimizers.SGD(0.001))),
        "hpcrep_no_overlap": with_env("HPCREP_OVERLAP", "0", optimizer_step(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)))),
        "hpcrep_python": with_env("HPCREP_NATIVE", "off", optimizer_step(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)))),
        "hpcrep_fp16": optimizer_step(hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.001), compression=hvd.Compression.fp16)),
        **{f"hpcrep_powersgd{r}": optimizer_step(hvd.DistributedOptimizer(
            keras.optimizers.SGD(0.001), compression=hvd.Compression.powersgd(r)))
           for r in POWERSGD_RANKS},
        **{f"powersgd{r}_compute": _powersgd_compute(variables, r) for r in POWERSGD_RANKS},
        **{f"powersgd{r}_compute_tfops": _powersgd_compute(variables, r, fused=False)
           for r in POWERSGD_RANKS},
        "hpcrep_no_chunk": with_env("HPCREP_ALLREDUCE_CHUNK", "0", optimizer_step(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)))),
        "hpcrep_autotuned": with_env("HPCREP_AUTOTUNE", "1", optimizer_step(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)))),
        # for the report's ceilings, not training steps: the forward pass and loss alone, and
        # the exchange alone (the gradients' bytes through the same engine, no compute)
        "forward": tf.function(lambda: loss_fn(labels, model(images, training=True))),
        "exchange": _exchange_step(variables, hvd.Compression.none),
        "exchange_fp16": _exchange_step(variables, hvd.Compression.fp16),
    })
    return out


def _exchange_step(variables: Sequence[Any], compression: Any) -> Callable[[], Any]:
    """A compiled step that only averages tensors shaped like ``variables``' gradients, one
    grouped allreduce as the optimizer's exchange would, and returns a scalar that depends on
    every result. Collective."""
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    grads = [tf.ones(v.shape, v.dtype) for v in variables]

    @tf.function
    def exchange() -> Any:
        averaged = hvd.grouped_allreduce(grads, compression=compression)
        return tf.add_n([tf.reshape(g, [-1])[0] for g in averaged])
    return exchange


def _powersgd_compute(variables: Sequence[Any], rank: int,
                      fused: bool = True) -> Callable[[], Any]:
    """A compiled step that runs PowerSGD's own arithmetic of one step on gradient-shaped
    tensors, with no exchange, and returns a scalar that depends on every result. With
    ``fused=False`` it is traced with TensorFlow's ops instead of the compiled kernels (what
    runs where the compiled op is not built). Local."""
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    grads = [tf.random.stateless_normal(v.shape, [rank, i], dtype=v.dtype)
             for i, v in enumerate(variables)]
    psgd = hvd.Compression.powersgd(rank)
    psgd.build(variables)

    @tf.function
    def compute() -> Any:
        out = psgd.compute_alone(grads, variables, fused=fused)
        return tf.add_n([tf.reshape(g, [-1])[0] for g in out])
    return compute


def powersgd_bytes(variables: Sequence[Any]) -> dict[str, int]:
    """Bytes one rank sends per compressed step at each of :data:`POWERSGD_RANKS`. Local."""
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    return {str(r): hvd.Compression.powersgd(r).bytes_per_step(variables)[0]
            for r in POWERSGD_RANKS}


def _horovod_step(model: Any, images: Any, labels: Any, loss_fn: Any) -> Callable[[], Any]:
    """The same step with Horovod's ``grouped_allreduce``; starts Horovod. Collective."""
    import horovod.tensorflow as horovod  # noqa: PLC0415
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    horovod.init()
    opt = keras.optimizers.SGD(0.001)
    variables = model.trainable_variables

    @tf.function
    def horovod_step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        # Horovod's DistributedGradientTape fails on Keras 3 variables (no .ref()); its
        # grouped_allreduce is what it would call.
        grads = horovod.grouped_allreduce(tape.gradient(loss, variables), op=horovod.Average)
        opt.apply(grads, variables)
        return loss

    return horovod_step


def worker(image_size: int, batch: int, steps: int, reps: int, group: str = "hpcrep",
           only: Sequence[str] = ()) -> dict:
    """Time every variant (those named in ``only``, if any) inside the MPI job; rank 0 returns
    the results. Collective."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from hpcrep.tensorflow import native  # noqa: PLC0415

    from bench.timing import busy_seconds_between, machine_busy_seconds  # noqa: PLC0415
    from hpcrep import comm as hcomm  # noqa: PLC0415

    hvd.init()
    comm = hcomm.comm()
    rng = np.random.default_rng(hvd.rank())
    images = tf.constant(rng.random((batch, image_size, image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, batch), tf.int64)
    model = keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                        classifier_activation=None)
    variants = _variants(model, images, labels, group)
    if only:
        variants = {k: v for k, v in variants.items() if k in only or k == "nosync"}
    for fn in variants.values():  # trace and warm up
        fn()
        fn().numpy()
    tuned = settle_autotune(variants["hpcrep_autotuned"]) if "hpcrep_autotuned" in variants \
        else None
    times: dict[str, list[float]] = {k: [] for k in variants}
    busy: dict[str, list[float]] = {k: [] for k in variants}
    cores = 0
    from bench.timing import interleaved_order  # noqa: PLC0415

    for names in interleaved_order(list(variants), reps):
        for name in names:
            fn = variants[name]
            comm.Barrier()
            before = machine_busy_seconds()
            start = time.perf_counter()
            for _ in range(steps):
                loss = fn()
            loss.numpy()
            elapsed = (time.perf_counter() - start) / steps
            comm.Barrier()
            seconds, cores = busy_seconds_between(comm, before, machine_busy_seconds())
            times[name].append(max(comm.allgather(elapsed)))
            busy[name].append(seconds / steps)
    grads_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    return {"step_ms": {k: float(np.median(v)) * 1e3 for k, v in times.items()},
            "busy_cpu_ms": {k: float(np.median(v)) * 1e3 for k, v in busy.items()} if cores
            else {}, "cores": cores,
            "all_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
            "ranks": hvd.size(), "hosts": sorted(set(comm.allgather(platform.node()))),
            "threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "native": native.status()[1], "gradient_bytes": grads_bytes,
            "powersgd_bytes": powersgd_bytes(model.trainable_variables), "autotune": tuned,
            "image_size": image_size, "batch": batch, "steps": steps, "reps": reps}


def settle_autotune(step: Callable[[], Any], limit: int = 300) -> Optional[dict]:
    """Run ``step`` (a training step traced with ``HPCREP_AUTOTUNE=1``; it may return a tensor,
    which is waited for, or a value already computed) until rank 0's tuner settles or ``limit``
    steps have run, then freeze the tuner; return what it did (rank 0; None elsewhere, or where
    the first step made no tuner: one rank, or without the compiled path). Collective."""
    from hpcrep import comm as hcomm  # noqa: PLC0415
    from hpcrep.tensorflow import autotune  # noqa: PLC0415

    comm = hcomm.comm()
    start = time.perf_counter()
    steps = 0
    while steps < limit:
        out = step()
        if hasattr(out, "numpy"):
            out.numpy()
        steps += 1
        tuner = autotune.current()
        search = tuner.search if tuner is not None else None
        if comm.bcast(tuner is None or (search is not None and search.settled)):
            break
    autotune.freeze()
    tuner = autotune.current()
    if tuner is None or tuner.search is None:
        return None
    search = tuner.search
    chosen = search.best[0] if search.settled else search.current
    return {"settled": search.settled, "steps": steps, "seconds": time.perf_counter() - start,
            "threshold": chosen.fusion, "chunk": chosen.chunk,
            "fp16": chosen.fp16,
            "trials": [{"step": t.step, "threshold": t.setting.fusion, "chunk": t.setting.chunk,
                        "fp16": t.setting.fp16, "ms": t.score * 1e3} for t in search.trials]}


POWERSGD_RANKS = (2, 4)
# Timed for the ceilings and PowerSGD's own cost, not training steps.
PROBES = ("forward", "exchange", "exchange_fp16",
          *(f"powersgd{r}_compute" for r in POWERSGD_RANKS),
          *(f"powersgd{r}_compute_tfops" for r in POWERSGD_RANKS))


def render_markdown(report: dict) -> str:
    """Return the report as Markdown: the training steps' table (efficiency = throughput /
    nosync's), the probes and the ceilings they give."""
    base, busy = report["step_ms"]["nosync"], report.get("busy_cpu_ms") or {}
    lines = [f"# Overlap benchmark ({report['date']})", "",
             f"ResNet-50 {report['image_size']}x{report['image_size']}, batch {report['batch']} "
             f"per rank, {report['ranks']} ranks on {', '.join(report['hosts'])}, "
             f"{report['threads']} TensorFlow thread(s) per rank; "
             f"{report.get('cluster', {}).get('link', 'no link cap')}; machine: "
             f"{report['machine']}. {report['native']}.", "",
             "| job | variant | step ms | machine CPU ms per step | throughput / the job's "
             "nosync |", "|---|---|---:|---:|---:|"]
    for name, ms in report["step_ms"].items():
        if name not in PROBES:
            lines.append(f"| hpcrep | {name} | {ms:.0f} | {_ms(busy.get(name))} | "
                         f"{base / ms:.2f} |")
    peer = report.get("horovod_job", {})
    if "step_ms" in peer:
        peer_base, peer_busy = peer["step_ms"]["nosync"], peer.get("busy_cpu_ms") or {}
        for name, ms in peer["step_ms"].items():
            lines.append(f"| horovod | {name} | {ms:.0f} | {_ms(peer_busy.get(name))} | "
                         f"{peer_base / ms:.2f} |")
    lines += ["", f"Gradients: {report['gradient_bytes'] / 1e6:.1f} MB per step. Each figure is "
              f"the median over {report['reps']} repetitions (variants interleaved) of the "
              f"slowest rank's mean over {report['steps']} steps. Machine CPU: the busy time of "
              f"every core of the job's machines (/proc/stat, kernel network work included; "
              f"{report.get('cores') or '?'} cores in all)."]
    sent = report.get("powersgd_bytes") or {}
    if sent:
        lines += ["", "PowerSGD sends per rank and step " + "; ".join(
            f"rank {r}: {b / 1e6:.2f} MB ({b / report['gradient_bytes']:.3f} of float32)"
            for r, b in sent.items()) + " (two allreduces of factors and the uncompressed "
            "vectors)."]
    tuned = report.get("autotune")
    if tuned:
        from hpcrep.comm.autotune import Setting  # noqa: PLC0415

        state = (f"settled after {tuned['steps']} training steps ({tuned['seconds']:.0f} s, "
                 f"{len(tuned['trials'])} settings timed)" if tuned["settled"] else
                 f"had not settled after {tuned['steps']} steps")
        lines += ["", f"hpcrep_autotuned: the tuner {state} on "
                  f"{Setting(tuned['threshold'], tuned['chunk'], tuned.get('fp16', False))}, then "
                  "was frozen for the "
                  "timed repetitions. Its timed settings (median step ms): " + "; ".join(
                      f"{Setting(t['threshold'], t['chunk'], t.get('fp16', False))}: {t['ms']:.0f}"
                      for t in tuned["trials"]) + "."]
    probes = [f"{name} {report['step_ms'][name]:.0f} ms ({_ms(busy.get(name))} ms of CPU)"
              for name in PROBES if name in report["step_ms"]]
    if probes:
        lines += ["", "Timed alone, not training steps: " + "; ".join(probes) + "."]
    lines += _ceiling(report)
    if "step_ms" in peer:
        lines += ["", "Horovod ran in a job of its own: once started, its background thread "
                  "slows every step in its process, its nosync included (here "
                  f"{peer['step_ms']['nosync']:.0f} against {base:.0f} ms)."]
    elif peer:
        lines += ["", f"Horovod: {peer.get('status')}; {peer.get('how_to_build', '')}"]
    return "\n".join(lines) + "\n"


def _ceiling(report: dict) -> list[str]:
    """Markdown lines: the efficiency a perfectly overlapped exchange could reach, float32 and
    float16, from two lower bounds on a step.

    - The wire (under a link cap): no bucket leaves before the backward pass starts, so a step
      takes at least the forward pass plus the exchange at the link's rate
      (``bench.cluster.allreduce_lower_bound_ms``).
    - The CPU: the job's cores must do the unsynchronised step's work plus the exchange's (both
      measured as machine CPU per step), so a step takes at least their sum over the cores. It
      binds where the ranks leave no core to spare, as on the test cluster, whose nodes share
      this machine's cores.
    """
    steps, busy, cores = report["step_ms"], report.get("busy_cpu_ms") or {}, report.get("cores")
    cluster, forward = report.get("cluster") or {}, steps.get("forward")
    capped = bool(cluster.get("nodes")) and cluster.get("link", "uncapped") != "uncapped"
    base, nbytes = steps["nosync"], report["gradient_bytes"]
    from bench.cluster import allreduce_lower_bound_ms  # noqa: PLC0415

    rows = []
    sent = report.get("powersgd_bytes") or {}
    # PowerSGD's CPU is its own arithmetic (the probe timed alone); its exchange of about 1 MB
    # is left out of its CPU floor.
    for label, size, probe, variant in (
            ("float32", nbytes, "exchange", "hpcrep"),
            ("float16 (Compression.fp16)", nbytes // 2, "exchange_fp16", "hpcrep_fp16"),
            *((f"PowerSGD rank {r}", sent[str(r)], f"powersgd{r}_compute",
               f"hpcrep_powersgd{r}") for r in POWERSGD_RANKS if str(r) in sent)):
        wire_floor = cpu_floor = None
        if capped and forward:
            wire_floor = forward + allreduce_lower_bound_ms(size, cluster["nodes"],
                                                            cluster["link"])
        if cores and "nosync" in busy and probe in busy:
            cpu_floor = (busy["nosync"] + busy[probe]) / cores
        if wire_floor is None and cpu_floor is None:
            continue
        floor = max(base, wire_floor or 0.0, cpu_floor or 0.0)
        reached = (f"{variant}: {base / steps[variant]:.2f}, {floor / steps[variant]:.2f} of the "
                   "ceiling" if variant in steps else "-")
        rows.append(f"| {label} | {_ms(wire_floor)} | {_ms(cpu_floor)} | {base / floor:.2f} | "
                    f"{reached} |")
    if not rows:
        return []
    return ["", "Ceilings: the least time a step can take with the exchange perfectly "
            "overlapped. Wire: the forward pass "
            f"({_ms(forward)} ms) plus the exchange at the link's rate, since no bucket leaves "
            "before the backward pass starts. CPU: nosync's machine CPU plus the exchange's "
            "(PowerSGD: its own arithmetic), each timed alone, over the "
            f"{cores or '?'} cores; it binds where the ranks leave no "
            "core to spare (the test cluster's nodes share this machine's cores).", "",
            "| gradients | wire floor ms | CPU floor ms | efficiency at most | measured |",
            "|---|---:|---:|---:|---|", *rows]


def _ms(value: Optional[float]) -> str:
    """A figure in whole ms for the report, or '-' where it was not measured."""
    return "-" if value is None else f"{value:.0f}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cluster-nodes", type=int, default=0)
    parser.add_argument("--link", help="with --cluster-nodes: link cap (2gbit, ...)")
    parser.add_argument("--out", help="report directory (default reports/overlap-<timestamp>)")
    parser.add_argument("--variants", default="",
                        help="comma-separated variants and probes to time (default: all; "
                             "nosync always)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--group", default="hpcrep", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(args.image_size, args.batch, args.steps, args.reps, args.group,
                        [v for v in args.variants.split(",") if v])
        from hpcrep import comm  # noqa: PLC0415

        if comm.rank() == 0:
            with open(args.worker, "w") as f:
                json.dump(result, f)
        return 0
    from bench.peers import horovod_status  # noqa: PLC0415

    out = args.out or os.path.join(
        ROOT, "reports", "overlap-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    horovod = horovod_status(ROOT)
    jobs = [("hpcrep", sys.executable)]
    if horovod["status"] == "importable":
        jobs.append(("horovod", horovod["python"]))
    cluster_info: dict = {}
    if args.cluster_nodes:
        from bench.cluster import cluster  # noqa: PLC0415

        with cluster(args.cluster_nodes, args.link) as c:
            cluster_info = c.describe()
            results = [_run_job(args, out, group, python, c) for group, python in jobs]
    else:
        results = [_run_job(args, out, group, python, None) for group, python in jobs]
    report = results[0]
    if len(results) > 1:
        report["horovod_job"] = results[1]
    else:
        report["horovod_job"] = {"status": horovod["status"],
                                 "how_to_build": horovod.get("how_to_build", "")}
    report.update(date=datetime.datetime.now().isoformat(timespec="seconds"),
                  machine=f"{platform.node()}, {os.cpu_count()} cores", cluster=cluster_info)
    with open(os.path.join(out, "overlap.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = render_markdown(report)
    with open(os.path.join(out, "overlap.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"report: {out}/overlap.md")
    return 0


def _run_job(args: argparse.Namespace, out: str, group: str, python: str, cluster: Any) -> dict:
    """Run one MPI job timing ``group``'s variants under ``python``; return rank 0's result."""
    env = dict(os.environ, HPCREP_THREADS=os.environ.get("HPCREP_THREADS", "1"),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    fd, result_path = tempfile.mkstemp(suffix=".json", dir=out)
    os.close(fd)
    command = [python, "-m", "bench.overlap", "--worker", result_path, "--group", group,
               "--image-size", str(args.image_size), "--batch", str(args.batch),
               "--steps", str(args.steps), "--reps", str(args.reps),
               "--variants", args.variants]
    if cluster is not None:
        launch = cluster.mpirun_command(args.ranks, command)
    else:
        launch = [sys.executable, "-m", "hpcrep.launch.mpirun", "-n", str(args.ranks), "--",
                  *command]
    try:
        subprocess.run(launch, env=env, check=True, cwd=ROOT, timeout=3600)
        with open(result_path) as f:
            return json.load(f)
    finally:
        os.unlink(result_path)


if __name__ == "__main__":
    sys.exit(main())
