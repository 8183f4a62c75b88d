"""ResNet-50 data-parallel training or benchmark with the explicit API (``hpcrep.tensorflow``).

Run on N ranks from the repository's top directory:
``mpirun -n N python -m jobs.resnet [options]`` (or ``srun``).

- Training (default): synthetic images, or ``--dataset fashion-mnist`` (Debian package, offline,
  through :mod:`hpcrep.data`) with ``--arch small`` for the quick ResNet-style convergence check;
  prints the test accuracy and exits 1 below ``--min-accuracy``. ``--sync`` swaps a benchmark
  variant under the same step (default hpcrep's ``DistributedGradientTape``).
- Benchmark (``--bench-json PATH``, what ``hpcrep bench`` runs): times the same training step
  with each variant in ``--modes`` underneath (hpcrep, nosync, mpi4py, horovod;
  :mod:`bench.variants`), or ``--modes mwms`` alone for
  ``tf.distribute.MultiWorkerMirroredStrategy`` on localhost (one worker per rank, ports from
  ``--port-base``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.job import (Timed, add_bench_arguments, gradient_summary, parse_modes, run_modes,
                       weights_agree, write_result)
from bench.exposed import trace_path
from bench.sync import MODES


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=["resnet50", "small"], default="resnet50")
    p.add_argument("--dataset", choices=["synthetic", "fashion-mnist"], default="synthetic")
    p.add_argument("--image-size", type=int, default=32, help="ResNet-50 input size (>= 32)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch (weak scaling)")
    p.add_argument("--base-lr", type=float, default=0.1, help="learning rate for a 256 batch")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-examples", type=int, default=0, help="use the first N (0: all)")
    p.add_argument("--test-examples", type=int, default=2000)
    p.add_argument("--sync", choices=list(MODES), default="hpcrep")
    p.add_argument("--compression", default="none", metavar="KIND",
                   help="training (--sync hpcrep): none, fp16, powersgd:R or powersgd:R:W "
                        "(PowerSGD rank R, W uncompressed warm-up steps)")
    p.add_argument("--min-accuracy", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0,
                   help="seeds Python, NumPy, TensorFlow and Keras (plus the rank)")
    p.add_argument("--result-json", help="rank 0 writes the training result here")
    p.add_argument("--port-base", type=int, default=23456, help="first port for --modes mwms")
    add_bench_arguments(p, extra_modes=["mwms"])
    return p.parse_args(argv)


def load_data(args: argparse.Namespace, rank: int, size: int):
    from hpcrep.data import fashion_mnist_split, shard_for  # noqa: PLC0415

    x, y = fashion_mnist_split("train", args.train_examples)
    shard = shard_for(len(x), args.batch, rank, size)
    x, y = x[shard.start:shard.stop], y[shard.start:shard.stop]
    xt, yt = fashion_mnist_split("test", args.test_examples)
    return prepare(x, args), y, prepare(xt, args), yt


def prepare(images: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    x = images.astype(np.float32)[..., None] / 255.0
    if args.arch == "resnet50":  # 28x28x1 -> 32x32x3
        x = np.repeat(np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0))), 3, axis=-1)
    return x


def build(args: argparse.Namespace, size: int, classes: int, distributed_tape=None):
    from jobs.resnet import model as resnet  # noqa: PLC0415

    if args.arch == "small":
        net = resnet.small_resnet((28, 28, 1), classes)
    else:
        side = 32 if args.dataset == "fashion-mnist" else args.image_size
        net = resnet.resnet50(side, 3, classes)
    peak = resnet.scaled_learning_rate(args.base_lr, args.batch * size)
    return resnet.Classifier(net, peak, distributed_tape=distributed_tape), peak


def train(args: argparse.Namespace) -> int:
    import keras  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from jobs.resnet import model as resnet  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # Keras 3 initialisers ignore tf.random.set_seed
    if args.dataset == "fashion-mnist":
        x, y, xt, yt = load_data(args, rank, size)
    else:
        rng = np.random.default_rng(rank)
        x = rng.random((args.batch * 8, args.image_size, args.image_size, 3), np.float32)
        y = rng.integers(0, 10, len(x))
        xt, yt = x[:args.batch], y[:args.batch]
    clf, peak = build(args, size, 10, tape_with_compression(args))
    hvd.broadcast_variables(clf.variables, root_rank=0)
    steps_per_epoch = len(x) // args.batch
    warmup_steps = int(args.warmup_epochs * steps_per_epoch)
    start, step, losses = time.time(), 0, []
    for epoch in range(args.epochs):
        order = np.random.default_rng(1000 * epoch + rank).permutation(len(x))
        for i in range(steps_per_epoch):
            idx = np.sort(order[i * args.batch:(i + 1) * args.batch])
            clf.set_learning_rate(resnet.scheduled_learning_rate(
                step, warmup_steps, args.epochs * steps_per_epoch, peak, size))
            losses.append(float(clf.train_step(x[idx], y[idx])))
            step += 1
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses[-steps_per_epoch:]):.4f}", flush=True)
    accuracy = clf.accuracy(xt, yt)
    agree = weights_agree(clf.model.trainable_variables)
    result = {"accuracy": accuracy, "weights_agree": agree, "steps": step,
              "first_loss": losses[0], "last_loss": float(np.mean(losses[-10:])),
              "seconds": time.time() - start, "ranks": size, "compression": args.compression}
    if rank == 0:
        print(json.dumps(result), flush=True)
    write_result(args.result_json, result)
    return 0 if accuracy >= args.min_accuracy and agree else 1


def tape_with_compression(args: argparse.Namespace):
    """The ``DistributedGradientTape`` of ``--sync``, with ``--compression`` (hpcrep only): one
    compression object for the whole run, since PowerSGD keeps its state in it. Local."""
    import functools  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.variants import variant  # noqa: PLC0415
    from hpcrep import config  # noqa: PLC0415

    try:
        kind, rank, warmup = config.SETTINGS["HPCREP_COMPRESSION"].parse(args.compression)
    except ValueError as exc:
        raise SystemExit(f"jobs.resnet: --compression {args.compression!r}: {exc}") from None
    if kind == "none":
        return variant(args.sync).DistributedGradientTape
    if args.sync != "hpcrep":
        raise SystemExit(f"jobs.resnet: --compression needs --sync hpcrep (got {args.sync})")
    compression = (hvd.Compression.fp16 if kind == "fp16"
                   else hvd.Compression.powersgd(rank, warmup_steps=warmup))
    return functools.partial(hvd.DistributedGradientTape, compression=compression)


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    clf, _ = build(args, size, 1000)
    hvd.broadcast_variables(clf.variables, root_rank=0)
    rng = np.random.default_rng(rank)
    images = tf.constant(rng.random((args.batch, args.image_size, args.image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, args.batch))

    def factory(v) -> Timed:
        train_step = clf.compile_step(v.DistributedGradientTape)  # the same step, v underneath
        # Every variant trains the same model: the weights check broadcasts it (and the
        # optimizer's slots) from rank 0 before its one step.
        return Timed(lambda: train_step(images, labels).numpy(), lambda: clf.variables,
                     lambda: clf.model.trainable_variables)

    runs = run_modes(factory, modes, args.rounds, args.steps, args.batch * size,
                     trace_file=trace_path(args.bench_json))
    write_result(args.bench_json, {"model": "resnet50", "unit": "images/s", "runs": runs,
                                   **gradient_summary(clf.model.trainable_variables),
                                   "config": vars(args)})
    return 0


MWMS_PACK_BYTES = 16 << 20  # hpcrep's default fusion threshold (HPCREP_FUSION_THRESHOLD)


def bench_mwms(args: argparse.Namespace) -> int:
    """Time ResNet-50 steps under MultiWorkerMirroredStrategy, one worker per MPI rank, with
    gradients all-reduced in packs of 16 MiB (``CommunicationOptions(bytes_per_pack)``, like
    hpcrep's fusion buffers) over TensorFlow's collective ops (gRPC on localhost), interleaved
    with the same step on a plain model outside the strategy (``nosync``, this job's own).
    Self-checks: the probe gradient of :mod:`bench.selfcheck` through the strategy's all-reduce,
    and the weights' digests across ranks after the timing."""
    from mpi4py import MPI  # noqa: PLC0415

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{args.port_base + i}" for i in range(size)]},
        "task": {"type": "worker", "index": rank}})
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from hpcrep.tensorflow.basics import configure_threads  # noqa: PLC0415
    import hpcrep.comm  # noqa: PLC0415
    from bench import selfcheck  # noqa: PLC0415
    from bench.job import split_communication  # noqa: PLC0415
    from bench.timing import time_rounds  # noqa: PLC0415
    from jobs.resnet import model as resnet  # noqa: PLC0415

    hpcrep.comm.init()
    configure_threads()
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=MWMS_PACK_BYTES)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    global_batch = args.batch * size
    lr = resnet.scaled_learning_rate(args.base_lr, global_batch)
    with strategy.scope():
        model = resnet.resnet50(args.image_size, 3, 1000)
        optimizer = keras.optimizers.SGD(lr, momentum=0.9)
        optimizer.build(model.trainable_variables)
    plain = resnet.resnet50(args.image_size, 3, 1000)  # outside the strategy: no exchange
    plain_opt = keras.optimizers.SGD(lr, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction="none")
    rng = np.random.default_rng(rank)
    images = tf.constant(rng.random((args.batch, args.image_size, args.image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, args.batch))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x, training=True))) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (sum)
        return loss

    @tf.function
    def plain_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, plain(x, training=True))) / args.batch
        plain_opt.apply(tape.gradient(loss, plain.trainable_variables), plain.trainable_variables)
        return loss

    step_fn = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))

    # The probe: the strategy's all-reduce of this rank's known gradient, over the size.
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    coefficients = selfcheck.probe_coefficients(shapes, rank)
    mean, tolerance = selfcheck.exact_mean_and_tolerance(coefficients)
    consts = [tf.constant(c) for c in coefficients]

    def probe_replica():
        ctx = tf.distribute.get_replica_context()
        return [g / size for g in ctx.all_reduce(tf.distribute.ReduceOp.SUM, consts,
                                                 options=options)]

    probed = tf.function(lambda: strategy.run(probe_replica))()
    result = [np.asarray(strategy.experimental_local_results(g)[0]) for g in probed]
    gradient = selfcheck.gradient_verdict(result, mean, tolerance, True, size)
    del coefficients, mean, tolerance, probed, result

    runs = time_rounds({"mwms": lambda: step_fn(images, labels),
                        "nosync": lambda: plain_step(images, labels).numpy()},
                       args.rounds, args.steps, global_batch)
    digests = MPI.COMM_WORLD.allgather(selfcheck.weights_digest(
        [strategy.experimental_local_results(v)[0] if hasattr(v, "values") else v
         for v in model.trainable_variables]))
    runs["mwms"]["check"] = {"gradient": gradient,
                             "weights": selfcheck.weights_verdict(digests, True)}
    runs["mwms"]["check"]["ok"] = gradient["ok"] and runs["mwms"]["check"]["weights"]["ok"]
    runs["nosync"]["check"] = {"ok": True, "note": "a plain model outside the strategy: "
                               "nothing to check"}
    write_result(args.bench_json, {
        "model": "resnet50", "unit": "images/s", "runs": split_communication(runs),
        "mwms": {"bytes_per_pack": MWMS_PACK_BYTES, "implementation": "AUTO (RING on CPU)",
                 "transport": "gRPC over localhost TCP"},
        **gradient_summary(model.trainable_variables), "config": vars(args)})
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.bench_json:
        modes = parse_modes(args.modes, list(MODES) + ["mwms"])
        if "mwms" in modes:
            if modes != ["mwms"]:
                raise SystemExit("--modes mwms must be alone: the strategy must exist before "
                                 "any other TensorFlow work in the process")
            return bench_mwms(args)
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    return bench(args, modes) if args.bench_json else train(args)
