"""A resumable data-parallel training run: the job that the kill and Slurm requeue tests run.

Trains a small dense regressor with ``hvd.DistributedOptimizer`` for ``--steps`` steps, saving an
HDF5 checkpoint every ``--save-every`` steps and whenever a pre-timeout signal (SIGUSR1) arrives
on any rank. Started again with the same command it resumes from the newest good checkpoint:
weights, optimizer slots, RNG state and the input position (the step; batch ``s`` of rank ``r``
is a pure function of ``(s, r)``). Ops are made deterministic, so an interrupted and resumed run
ends bitwise equal to an uninterrupted one.

With ``--mixed-precision`` the model computes in float16 (Keras's ``mixed_float16`` policy) and
the optimizer is ``hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(SGD))``: gradients
are averaged before the loss scale's finiteness check, so every rank skips the same steps. The loss
scale moves during the run: it doubles after every ``--growth-steps`` finite steps, and at every
step ``s`` with ``s % 10 == 7`` rank ``(s // 10) % size`` alone feeds an input past float16's
range, so that step overflows and is skipped everywhere, and the scale halves. The checkpoint holds
the scale and its step counter (they are optimizer variables), so the resumed run skips and scales
as the uninterrupted one does.

With ``--powersgd R`` gradients travel as PowerSGD rank-R factors with error feedback
(``hvd.Compression.powersgd``, uncompressed for the first ``--warmup`` steps); the checkpoint
then also holds every rank's own error buffers, so the resumed run is still bitwise the same.

    python -m hpcrep.launch.mpirun -n 4 -- python slurm/examples/train_resumable.py \
        --dir /tmp/run1 --steps 60 --out /tmp/run1/final.npz
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--out", help="rank 0 writes the final weights here (.npz)")
    parser.add_argument("--out-optimizer", help="rank 0 writes the final optimizer state here")
    parser.add_argument("--progress", help="rank r writes '<pid> <step>' to PROGRESS.r each step")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="float16 compute with a dynamic loss scale that moves during the run")
    parser.add_argument("--initial-scale", type=float, default=2.0 ** 15,
                        help="--mixed-precision: the loss scale to start from (Keras's default)")
    parser.add_argument("--growth-steps", type=int, default=4,
                        help="--mixed-precision: finite steps between doublings of the loss scale")
    parser.add_argument("--powersgd", type=int, default=0,
                        help="PowerSGD compression of this rank (0: none)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="--powersgd: steps averaged uncompressed first")
    parser.add_argument("--requeue", action="store_true",
                        help="on the signal: checkpoint, then scontrol requeue this Slurm job")
    parser.add_argument("--hold-at", type=int, default=-1, metavar="STEP",
                        help="first run only: after step STEP, wait (at most 300 s) for the "
                        "signal, so that a test's signal never races the end of the job")
    args = parser.parse_args(argv)

    # Watch for the pre-timeout signal before the slow imports: its default action would kill
    # the rank if it arrived during start-up.
    from hpcrep.checkpoint import CheckpointManager, PreemptionSignal, requeue, restart_count
    signal_watch = PreemptionSignal()

    import keras
    import tensorflow as tf

    import hpcrep.tensorflow as hvd
    from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state

    hvd.init()
    tf.config.experimental.enable_op_determinism()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(1234)
    # Op determinism leaves TensorFlow without a global generator; this job draws from one.
    tf.random.set_global_generator(tf.random.Generator.from_seed(1234))
    if args.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(1)])
    sgd = keras.optimizers.SGD(0.02, momentum=0.9)
    compression = (hvd.Compression.powersgd(args.powersgd, warmup_steps=args.warmup)
                   if args.powersgd else hvd.Compression.none)
    if args.mixed_precision:  # averaged first, then checked: every rank skips the same steps
        opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
            sgd, initial_scale=args.initial_scale, dynamic_growth_steps=args.growth_steps),
            compression=compression)
    else:
        opt = hvd.DistributedOptimizer(sgd, compression=compression)
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)
    w_true = np.linspace(-1, 1, 8).astype("float32")[:, None]

    manager = CheckpointManager(args.dir, keep=3)
    ckpt = manager.restore()
    start = 0
    if ckpt is not None:
        load_training_state(ckpt, model, opt)
        start = int(ckpt.group("input")["next_step"])
    print(f"rank {rank}/{size}: restart_count={restart_count()} start_step={start}"
          + (f" resumed_from={os.path.basename(ckpt.path)}" if ckpt else ""), flush=True)

    def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
        """Data that is a pure function of (step, rank), plus label noise drawn from the global
        generators (Python's, numpy's, TensorFlow's): a resumed run equals an uninterrupted one
        only if the checkpoint restored all three."""
        rng = np.random.default_rng([step, rank])
        x = rng.normal(size=(args.batch, 8)).astype("float32")
        noise = (np.random.normal(size=(args.batch, 1)) * random.random()).astype("float32")
        noise += 0.01 * tf.random.get_global_generator().normal([args.batch, 1]).numpy()
        if args.mixed_precision and step % 10 == 7 and rank == (step // 10) % size:
            x[0, 0] = 1e5  # past float16's largest value: this rank's gradients overflow
        return x, x @ w_true + 0.01 * noise

    def save(next_step: int, **meta: int) -> None:
        manager.save({**training_state(model, opt), "input": {"next_step": next_step}},
                     step=next_step, **meta)

    loss = float("nan")
    for step in range(start, args.steps):
        x, y = batch(step)
        with tf.GradientTape() as tape:
            y_hat = tf.cast(model(x, training=True), tf.float32)
            loss_t = tf.reduce_mean(tf.square(y_hat - y))
            scaled = opt.scale_loss(loss_t)  # times the loss scale (plain SGD: unchanged)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        loss = float(loss_t)
        if args.progress:
            with open(f"{args.progress}.{rank}", "w") as f:
                f.write(f"{os.getpid()} {step + 1}\n")
        if step + 1 == args.hold_at and restart_count() == 0:
            for _ in range(1500):  # a count, not a clock: every rank polls as often as the others
                if signal_watch.agreed():
                    break
                time.sleep(0.2)
        if signal_watch.agreed():
            save(step + 1, preempted=1)
            print(f"rank {rank}: signal received; checkpoint at step {step + 1}", flush=True)
            if args.requeue and rank == 0:
                requeue()
                print("rank 0: requeued the job", flush=True)
            hvd.barrier()
            if args.requeue:
                time.sleep(600)  # Slurm ends this run; the requeued one resumes
            return 0
        if (step + 1) % args.save_every == 0:
            save(step + 1)
        time.sleep(args.sleep)
    signal_watch.ignore()  # finished: a late signal must not kill the job while it exits
    if rank == 0:
        scale = f" loss_scale={float(opt.dynamic_scale.numpy()):g}" if args.mixed_precision else ""
        print(f"done: steps={args.steps} loss={loss:.6f} applied={int(opt.iterations.numpy())}"
              f"{scale}", flush=True)
        if args.out:
            np.savez(args.out, *[v.numpy() for v in model.variables])
        if args.out_optimizer:  # slots, iterations, and the loss scale with its step counter
            np.savez(args.out_optimizer, **{f"{i:02d}_{v.name}": v.numpy()
                                            for i, v in enumerate(opt.variables)})
    hvd.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
