"""Sharded optimizer state (ZeRO-1) checkpointed at one number of ranks, resumed at another.

``--phase save``: train STEPS1 steps with ``DistributedOptimizer(Adam, shard_optimizer_state=
True)`` in a ``tf.function`` loop, checkpoint with ``hpcrep.checkpoint`` into ``--dir``, then
train STEPS2 more (the uninterrupted reference). ``--phase resume``: a fresh model (other
weights) and optimizer (sharded, or plain with ``--plain``) restore the checkpoint and train the
STEPS2 steps. Each step's global batch is the same GLOBAL rows whatever the number of ranks (rank
r takes its equal share), so the trajectories are comparable across rank counts.

Rank 0 writes ``OUT/<phase>.npz``: ``saved_*``/``restored_*`` (the optimizer state in the
unsharded layout at the checkpoint) and ``final_*`` (weights at the end). Every rank prints
``zero-digest <sha256>`` of its final weights and optimizer state (gathered).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import numpy as np

GLOBAL, STEPS1, STEPS2 = 16, 4, 3


def batch(step: int, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    x = rng.normal(size=(GLOBAL, 6)).astype("float32")
    y = np.stack([x.sum(1), x[:, 0] * x[:, 1]], 1).astype("float32")
    rows = GLOBAL // size
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["save", "resume"], required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    import hpcrep.tensorflow as hvd
    from hpcrep.checkpoint import CheckpointManager
    from hpcrep.tensorflow import zero
    from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(1 if args.phase == "save" else 50)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(7, activation="tanh"),
                              keras.layers.Dense(2)])  # 6*7 + 7 + 7*2 + 2 = 65: padded slices
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.02),
                                   shard_optimizer_state=not args.plain)
    opt.build(model.trainable_variables)
    assert zero.is_sharded(opt) == (not args.plain and size > 1)

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    manager = CheckpointManager(args.dir, keep=1)
    out: dict[str, np.ndarray] = {}
    if args.phase == "save":
        hvd.broadcast_variables(model.variables, 0)
        for s in range(STEPS1):
            step(*batch(s, rank, size))
        state = training_state(model, opt)  # collective: gathers the sharded slots
        manager.save(state, step=STEPS1)
        out.update({f"saved_{i:03d}": a for i, a in enumerate(state["optimizer"])})
    else:
        ckpt = manager.restore()
        assert ckpt is not None and ckpt.step == STEPS1
        load_training_state(ckpt, model, opt)
        out.update({f"restored_{i:03d}": a for i, a in enumerate(zero.state_arrays(opt))})
    for s in range(STEPS1, STEPS1 + STEPS2):
        step(*batch(s, rank, size))
    final = [v.numpy() for v in model.trainable_variables] + zero.state_arrays(opt)
    out.update({f"final_{i:03d}": a for i, a in enumerate(final)})
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in final))
    print(f"zero-digest {digest.hexdigest()} rank {rank}", file=sys.stderr, flush=True)
    if rank == 0:
        np.savez(os.path.join(args.out, f"{args.phase}{'-plain' if args.plain else ''}.npz"),
                 **out)


if __name__ == "__main__":
    main()
