"""Class-conditional SN-GAN data-parallel training or benchmark with ``hpcrep.tensorflow``.

Run on N ranks:  ``mpirun -n N python jobs/sngan.py [options]``  (or ``srun``).

- Training (default): ``--dataset fashion-mnist`` (offline Debian package, resized to
  ``--image-size``) or ``synthetic``; rank 0 writes losses and a class-separation figure (mean
  absolute pixel difference between samples of different classes from the same noise) to
  ``--result-json``; exits 1 if a loss is not finite.
- Benchmark (``--bench-json PATH``): times generator updates (each after ``--n-dis``
  discriminator updates) under each synchroniser in ``--modes``.
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
    p.add_argument("--dataset", choices=["synthetic", "fashion-mnist"], default="synthetic")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--channels", type=int, default=3, help="synthetic data channels")
    p.add_argument("--g-ch", type=int, default=64)
    p.add_argument("--d-ch", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="per-rank batch (weak scaling)")
    p.add_argument("--n-dis", type=int, default=5)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--iterations", type=int, default=100, help="generator updates")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds Python, NumPy, TensorFlow and Keras (plus the rank)")
    p.add_argument("--train-examples", type=int, default=0)
    p.add_argument("--sync", choices=list(MODES), default="hpcrep")
    p.add_argument("--result-json")
    add_bench_arguments(p)
    return p.parse_args(argv)


def load(args: argparse.Namespace, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    if args.dataset == "synthetic":
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (args.batch * 4, args.image_size, args.image_size, args.channels))
        return x.astype(np.float32), rng.integers(0, 10, len(x))
    import tensorflow as tf  # noqa: PLC0415

    from bench.models import fashion_mnist  # noqa: PLC0415

    x, y = fashion_mnist.load("train")
    x, y = fashion_mnist.shard(x, y, rank, size, args.train_examples)
    x = tf.image.resize(x[..., None].astype(np.float32), (args.image_size,) * 2).numpy()
    return x / 127.5 - 1.0, y


def batches(x: np.ndarray, y: np.ndarray, batch: int, seed: int):
    import tensorflow as tf  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    while True:
        idx = np.sort(rng.choice(len(x), batch, replace=False))
        yield tf.constant(x[idx]), tf.constant(y[idx].astype(np.int32))


def class_separation(gan, samples: int = 16) -> float:
    """Mean |pixel difference| between samples of different classes drawn from the same noise."""
    import tensorflow as tf  # noqa: PLC0415

    z = tf.random.stateless_normal((samples, gan.z_dim), seed=(1, 2))
    images = [gan.sample(z, tf.fill((samples,), c)).numpy() for c in range(gan.classes)]
    diffs = [np.mean(np.abs(images[a] - images[b]))
             for a in range(gan.classes) for b in range(a + 1, gan.classes)]
    return float(np.mean(diffs))


def build(args, x):
    from bench.models.sngan import SNGAN  # noqa: PLC0415

    return SNGAN(args.image_size, x.shape[-1], 10, args.g_ch, args.d_ch, batch=args.batch,
                 sync=args.sync != "nosync", n_dis=args.n_dis, lr=args.lr)


def train(args: argparse.Namespace) -> int:
    import keras  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.sync import make_synchronizer  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # Keras 3 initialisers ignore tf.random.set_seed
    x, y = load(args, rank, size)
    gan = build(args, x)
    hvd.broadcast_variables(gan.variables, root_rank=0)
    separation_at_start = class_separation(gan)
    sync, data = make_synchronizer(args.sync), batches(x, y, args.batch, rank)
    start, d_losses, g_losses = time.time(), [], []
    for it in range(args.iterations):
        d_loss, g_loss = gan.train_step(data, sync)
        d_losses.append(d_loss)
        g_losses.append(g_loss)
        if rank == 0 and (it + 1) % max(1, args.iterations // 5) == 0:
            print(f"iteration {it + 1}: d_loss {d_loss:.3f} g_loss {g_loss:.3f}", flush=True)
    result = {"d_losses": d_losses, "g_losses": g_losses,
              "finite": bool(np.all(np.isfinite(d_losses + g_losses))),
              "max_abs_loss": float(np.max(np.abs(d_losses + g_losses))),
              "class_separation_start": separation_at_start,
              "class_separation": class_separation(gan),
              "weights_agree": weights_agree(gan.generator.trainable_variables
                                             + gan.discriminator.trainable_variables),
              "seconds": time.time() - start, "ranks": size}
    if rank == 0:
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("losses")}), flush=True)
    write_result(args.result_json, result)
    return 0 if result["finite"] else 1


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from bench.timing import Stopwatch  # noqa: PLC0415

    rank, size = hvd.rank(), hvd.size()
    x, y = load(args, rank, size)
    watch, gans = Stopwatch(), {}

    def factory(sync, mode):
        args.sync = mode  # nosync also turns off the synchronised batch norm
        gan = gans[mode] = build(args, x)
        hvd.broadcast_variables(gan.variables, root_rank=0)
        data = batches(x, y, args.batch, rank)

        def step() -> float:
            gan.train_step(data, sync, watch)
            return watch.take()
        return step

    runs = run_modes(factory, modes, args.steps, args.warmup, args.batch * size * args.n_dis)
    gan = next(iter(gans.values()))
    params = gan.generator.trainable_variables + gan.discriminator.trainable_variables
    write_result(args.bench_json, {
        "model": "sngan", "unit": "real images/s", "runs": runs,
        **gradient_summary(params), "syncs_per_step": args.n_dis + 1, "config": vars(args)})
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    if args.bench_json:
        return bench(args, parse_modes(args.modes, MODES))
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
