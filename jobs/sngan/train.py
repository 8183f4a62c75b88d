"""Class-conditional SN-GAN data-parallel training or benchmark under ``hpcrep.replicator``.

Run on N ranks from the repository's top directory:
``mpirun -n N python -m jobs.sngan [options]`` (or ``srun``).

- Training (default): ``--dataset fashion-mnist`` (offline Debian package through
  :mod:`hpcrep.data`, resized to ``--image-size``) or ``synthetic``; rank 0 writes losses and a
  class-separation figure (mean absolute pixel difference between samples of different classes
  from the same noise) to ``--result-json``; with ``--samples-out PATH`` it also writes
  ``--samples`` generated images (classes in turn, in [-1, 1]) to an ``.npz`` file, which
  ``bench.convergence`` scores with a Frechet distance (:mod:`bench.fid`); exits 1 if a loss is
  not finite.
- Benchmark (``--bench-json PATH``, what ``hpcrep bench`` runs): times generator updates (each
  after ``--n-dis`` discriminator updates) with each variant in ``--modes`` underneath
  (:mod:`bench.variants`).
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
    p.add_argument("--samples-out", metavar="PATH",
                   help="rank 0 writes --samples generated images and their labels here (.npz)")
    p.add_argument("--samples", type=int, default=2000, help="how many for --samples-out")
    add_bench_arguments(p)
    return p.parse_args(argv)


def load(args: argparse.Namespace, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's real images in [-1, 1] (n, size, size, channels) and int32 labels."""
    if args.dataset == "synthetic":
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (args.batch * 4, args.image_size, args.image_size, args.channels))
        return x.astype(np.float32), rng.integers(0, 10, len(x)).astype(np.int32)
    import tensorflow as tf  # noqa: PLC0415

    from hpcrep.data import fashion_mnist_split, shard_for  # noqa: PLC0415

    x, y = fashion_mnist_split("train", args.train_examples)
    shard = shard_for(len(x), args.batch, rank, size)
    x, y = x[shard.start:shard.stop], y[shard.start:shard.stop]
    x = tf.image.resize(x[..., None].astype(np.float32), (args.image_size,) * 2).numpy()
    return x / 127.5 - 1.0, y.astype(np.int32)


def input_fn(x: np.ndarray, y: np.ndarray, batch: int, seed: int):
    """Return ``input_fn(ctx)``: this replica's (images, labels) batches, reshuffled every pass."""
    import tensorflow as tf  # noqa: PLC0415

    def make(ctx) -> tf.data.Dataset:
        return (tf.data.Dataset.from_tensor_slices((x, y))
                .shuffle(len(x), seed=seed + ctx.replica_id, reshuffle_each_iteration=True)
                .batch(batch, drop_remainder=True).repeat())
    return make


def class_separation(gan, samples: int = 16) -> float:
    """Mean |pixel difference| between samples of different classes drawn from the same noise."""
    import tensorflow as tf  # noqa: PLC0415

    z = tf.random.stateless_normal((samples, gan.z_dim), seed=(1, 2))
    images = [gan.sample(z, tf.fill((samples,), c)).numpy() for c in range(gan.classes)]
    diffs = [np.mean(np.abs(images[a] - images[b]))
             for a in range(gan.classes) for b in range(a + 1, gan.classes)]
    return float(np.mean(diffs))


def write_samples(gan, path: str, n: int, seed: int) -> None:
    """Write ``n`` samples (labels 0, 1, ..., 9, 0, ...; noise from ``seed``) to ``path`` as
    ``images`` (n, size, size, channels) float32 in [-1, 1] and ``labels``. Local (rank 0)."""
    import tensorflow as tf  # noqa: PLC0415

    labels = np.arange(n, dtype=np.int32) % gan.classes
    z = tf.random.stateless_normal((n, gan.z_dim), seed=(seed, 3))
    images = np.concatenate([gan.sample(z[i:i + 250], labels[i:i + 250]).numpy()
                             for i in range(0, n, 250)])
    tmp = path + ".tmp.npz"
    np.savez(tmp, images=images.astype(np.float32), labels=labels)
    os.replace(tmp, path)


def build(args, rep, x, y, variant=None, sync=None):
    from jobs.sngan.model import SNGAN  # noqa: PLC0415

    # hpcrep's own optimizer wrapping is the Replicator's (variant None or "hpcrep").
    wrap = None if variant is None or variant.name == "hpcrep" else variant.DistributedOptimizer
    if sync is None:
        sync = variant.sync_batch_norm if variant is not None else args.sync != "nosync"
    return SNGAN(rep, input_fn(x, y, args.batch, args.seed), args.image_size, x.shape[-1], 10,
                 args.g_ch, args.d_ch, batch=args.batch, sync=sync, n_dis=args.n_dis,
                 lr=args.lr, wrap_optimizer=wrap)


def train(args: argparse.Namespace) -> int:
    import keras  # noqa: PLC0415

    from bench.variants import variant  # noqa: PLC0415
    from hpcrep.replicator import Replicator  # noqa: PLC0415

    rep = Replicator()
    rank, size = rep.local_replica_ids[0], rep.num_replicas
    keras.utils.set_random_seed(args.seed + rank)  # Keras 3 initialisers ignore tf.random.set_seed
    x, y = load(args, rank, size)
    gan = build(args, rep, x, y, variant(args.sync))
    separation_at_start = class_separation(gan)
    start, d_losses, g_losses = time.time(), [], []
    for it in range(args.iterations):
        d_loss, g_loss = gan.train_step()
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
    if args.samples_out and rank == 0:
        write_samples(gan, args.samples_out, args.samples, args.seed)
    return 0 if result["finite"] else 1


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    from hpcrep.replicator import Replicator  # noqa: PLC0415

    rep = Replicator()
    rank, size = rep.local_replica_ids[0], rep.num_replicas
    x, y = load(args, rank, size)
    gans = {}

    def factory(v) -> Timed:
        # The same model and steps, v underneath. Batch norm is each replica's own in every
        # variant (as nosync's must be): the variants differ only in how gradients are averaged.
        gan = gans[v.name] = build(args, rep, x, y, v, sync=False)
        return Timed(gan.train_step, lambda: gan.variables,
                     lambda: gan.generator.trainable_variables
                     + gan.discriminator.trainable_variables, probe="optimizer")

    runs = run_modes(factory, modes, args.rounds, args.steps, args.batch * size * args.n_dis,
                     trace_file=trace_path(args.bench_json))
    gan = next(iter(gans.values()))
    params = gan.generator.trainable_variables + gan.discriminator.trainable_variables
    write_result(args.bench_json, {
        "model": "sngan", "unit": "real images/s", "runs": runs,
        **gradient_summary(params), "syncs_per_step": args.n_dis + 1,
        "batch_norm": "local in every variant", "config": vars(args)})
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    if args.bench_json:
        return bench(args, parse_modes(args.modes, MODES))
    return train(args)
