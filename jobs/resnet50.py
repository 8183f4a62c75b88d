"""ResNet-50 data-parallel training or benchmark with the explicit API (``hpcrep.tensorflow``).

Run on N ranks:  ``mpirun -n N python jobs/resnet50.py [options]``  (or ``srun``).

- Training (default): synthetic images, or ``--dataset fashion-mnist`` (Debian package, offline)
  with ``--arch small`` for the quick ResNet-style convergence check; prints the test accuracy and
  exits 1 below ``--min-accuracy``.
- Benchmark (``--bench-json PATH``): times steps under each synchroniser in ``--modes`` (hpcrep,
  nosync, mpi4py), or ``--modes mwms`` alone for ``tf.distribute.MultiWorkerMirroredStrategy`` on
  localhost (one worker per rank, ports from ``--port-base``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench.job import (add_bench_arguments, gradient_summary, parse_modes, run_modes,
                       weights_agree, write_result)
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
    p.add_argument("--min-accuracy", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0,
                   help="seeds Python, NumPy, TensorFlow and Keras (plus the rank)")
    p.add_argument("--result-json", help="rank 0 writes the training result here")
    p.add_argument("--port-base", type=int, default=23456, help="first port for --modes mwms")
    add_bench_arguments(p, extra_modes=["mwms"])
    return p.parse_args(argv)


def load_data(args: argparse.Namespace, rank: int, size: int):
    from bench.models import fashion_mnist  # noqa: PLC0415

    x, y = fashion_mnist.load("train")
    x, y = fashion_mnist.shard(x, y, rank, size, args.train_examples)
    xt, yt = fashion_mnist.load("test")
    xt, yt = xt[:args.test_examples], yt[:args.test_examples]
    return prepare(x, args), y, prepare(xt, args), yt


def prepare(images: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    x = images.astype(np.float32)[..., None] / 255.0
    if args.arch == "resnet50":  # 28x28x1 -> 32x32x3
        x = np.repeat(np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0))), 3, axis=-1)
    return x


def build(args: argparse.Namespace, size: int, classes: int):
    from bench.models import resnet  # noqa: PLC0415

    if args.arch == "small":
        model = resnet.small_resnet((28, 28, 1), classes)
    else:
        side = 32 if args.dataset == "fashion-mnist" else args.image_size
        model = resnet.resnet50(side, 3, classes)
    peak = resnet.scaled_learning_rate(args.base_lr, args.batch * size)
    return resnet.Classifier(model, peak), peak


def train(args: argparse.Namespace) -> int:
    import keras  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.models import resnet  # noqa: PLC0415
    from bench.sync import make_synchronizer  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # Keras 3 initialisers ignore tf.random.set_seed
    if args.dataset == "fashion-mnist":
        x, y, xt, yt = load_data(args, rank, size)
    else:
        rng = np.random.default_rng(rank)
        x = rng.random((args.batch * 8, args.image_size, args.image_size, 3), np.float32)
        y = rng.integers(0, 10, len(x))
        xt, yt = x[:args.batch], y[:args.batch]
    clf, peak = build(args, size, 10)
    hvd.broadcast_variables(clf.variables, root_rank=0)
    sync = make_synchronizer(args.sync)
    steps_per_epoch = len(x) // args.batch
    warmup_steps = int(args.warmup_epochs * steps_per_epoch)
    start, step, losses = time.time(), 0, []
    for epoch in range(args.epochs):
        order = np.random.default_rng(1000 * epoch + rank).permutation(len(x))
        for i in range(steps_per_epoch):
            idx = np.sort(order[i * args.batch:(i + 1) * args.batch])
            clf.set_learning_rate(resnet.scheduled_learning_rate(
                step, warmup_steps, args.epochs * steps_per_epoch, peak, size))
            loss, grads = clf.compute(x[idx], y[idx])
            clf.apply(sync(grads))
            losses.append(float(loss))
            step += 1
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {np.mean(losses[-steps_per_epoch:]):.4f}", flush=True)
    accuracy = clf.accuracy(xt, yt)
    agree = weights_agree(clf.model.trainable_variables)
    result = {"accuracy": accuracy, "weights_agree": agree, "steps": step,
              "first_loss": losses[0], "last_loss": float(np.mean(losses[-10:])),
              "seconds": time.time() - start, "ranks": size}
    if rank == 0:
        print(json.dumps(result), flush=True)
    write_result(args.result_json, result)
    return 0 if accuracy >= args.min_accuracy and agree else 1


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    import tensorflow as tf  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.timing import Stopwatch  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    clf, _ = build(args, size, 1000)
    hvd.broadcast_variables(clf.variables, root_rank=0)
    rng = np.random.default_rng(rank)
    images = tf.constant(rng.random((args.batch, args.image_size, args.image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, args.batch))
    watch = Stopwatch()

    def factory(sync, mode):
        def step() -> float:
            _, grads = clf.compute(images, labels)
            with watch:
                grads = sync(grads)
            clf.apply(grads)
            return watch.take()
        return step

    runs = run_modes(factory, modes, args.steps, args.warmup, args.batch * size)
    write_result(args.bench_json, {"model": "resnet50", "unit": "images/s", "runs": runs,
                                   **gradient_summary(clf.model.trainable_variables),
                                   "config": vars(args)})
    return 0


def bench_mwms(args: argparse.Namespace) -> int:
    """Time ResNet-50 steps under MultiWorkerMirroredStrategy, one worker per MPI rank."""
    from mpi4py import MPI  # noqa: PLC0415

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{args.port_base + i}" for i in range(size)]},
        "task": {"type": "worker", "index": rank}})
    import tensorflow as tf  # noqa: PLC0415

    from hpcrep.tensorflow.basics import configure_threads  # noqa: PLC0415
    import hpcrep.comm  # noqa: PLC0415
    from bench.models import resnet  # noqa: PLC0415
    from bench.timing import time_steps  # noqa: PLC0415

    hpcrep.comm.init()
    configure_threads()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch * size
    with strategy.scope():
        model = resnet.resnet50(args.image_size, 3, 1000)
        optimizer = tf.keras.optimizers.SGD(
            resnet.scaled_learning_rate(args.base_lr, global_batch), momentum=0.9)
        optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(reduction="none")
    rng = np.random.default_rng(rank)
    images = tf.constant(rng.random((args.batch, args.image_size, args.image_size, 3), np.float32))
    labels = tf.constant(rng.integers(0, 1000, args.batch))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x, training=True))) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))  # all-reduces (sum)
        return loss

    step_fn = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))

    def step() -> float:
        step_fn(images, labels)
        return 0.0

    timed = time_steps(step, args.steps, args.warmup, global_batch)
    timed["comm_ms"] = timed["compute_ms"] = timed["comm_fraction"] = None
    write_result(args.bench_json, {"model": "resnet50", "unit": "images/s",
                                   "runs": {"mwms": timed}, "config": vars(args)})
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


if __name__ == "__main__":
    sys.exit(main())
