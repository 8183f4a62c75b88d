"""Measure hpcrep's HDF5 input and checkpoint I/O: reader throughput against raw h5py, and
checkpoint save/restore times.

    python -m hpcrep.launch.mpirun -n 4 -- python bench/hdf5_io.py reader --file /tmp/fm.h5
    python -m hpcrep.launch.mpirun -n 1 -- python bench/hdf5_io.py checkpoint --dir /tmp/ck

``reader``: per rank, MB/s and batches/s of (a) raw h5py contiguous slices over the rank's
shard in order, (b) HDF5ShardReader (block-shuffled slices), (c) the tf.data Dataset over it,
and (d) h5py fancy indexing of random rows for contrast. The file is read once first, so
these are page-cache figures (this machine's disk is not what is measured).
``checkpoint``: ResNet-50 (weights=None, SGD with momentum) save and restore times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import h5py
import numpy as np


def _timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def reader(args: argparse.Namespace) -> None:
    import hpcrep.comm as hc  # noqa: PLC0415
    from hpcrep.data import HDF5ShardReader  # noqa: PLC0415
    hc.init()
    r, n = hc.rank(), hc.size()
    keys = ["x_train", "y_train"]
    rd = HDF5ShardReader(args.file, keys, args.batch, shuffle=True, seed=1)
    with h5py.File(args.file) as f:
        row_bytes = sum(f[k].dtype.itemsize * int(np.prod(f[k].shape[1:])) for k in keys)
        rows = rd.steps_per_epoch * args.batch
        mb = rows * row_bytes / 1e6
        ds = [f[k] for k in keys]

        def raw():
            for s in range(rd.steps_per_epoch):
                a = rd.shard.start + s * args.batch
                for d in ds:
                    d[a:a + args.batch]

        raw()  # warm the page cache
        t_raw = _timed(raw)
        idx = np.sort(np.random.default_rng(r).choice(f[keys[0]].shape[0], 10 * args.batch,
                                                      replace=False))
        t_fancy = _timed(lambda: [d[idx] for d in ds], 1) * rd.steps_per_epoch / 10
    t_reader = _timed(lambda: [None for _ in rd.batches(0)])
    from hpcrep.tensorflow.basics import configure_threads  # noqa: PLC0415
    configure_threads()
    from hpcrep.tensorflow.hdf5_dataset import hdf5_dataset  # noqa: PLC0415
    tfds = hdf5_dataset(args.file, keys, args.batch, seed=1)
    t_tf = _timed(lambda: [None for _ in tfds])
    res = {"raw h5py slices": t_raw, "HDF5ShardReader": t_reader, "tf.data hdf5_dataset": t_tf,
           "h5py fancy index (est.)": t_fancy}
    everyone = hc.allgather_object(res)
    if r == 0:
        print(f"{n} rank(s), batch {args.batch}, {rd.steps_per_epoch} steps/rank, "
              f"{mb:.1f} MB/rank/epoch")
        for name in res:
            ts = [e[name] for e in everyone]
            print(f"  {name:26s} per rank: {mb / max(ts):8.1f} - {mb / min(ts):8.1f} MB/s, "
                  f"{rd.steps_per_epoch / max(ts):9.0f} - {rd.steps_per_epoch / min(ts):9.0f} "
                  "batches/s")


def checkpoint(args: argparse.Namespace) -> None:
    import keras  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    from hpcrep.checkpoint import CheckpointManager  # noqa: PLC0415
    from hpcrep.tensorflow.checkpoint_callback import load_training_state, training_state  # noqa: PLC0415
    hvd.init()
    model = keras.applications.ResNet50(weights=None)
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    mgr = CheckpointManager(args.dir, keep=2)
    saves, restores = [], []
    for i in range(args.repeat):
        t = time.perf_counter()
        state = training_state(model, opt)
        path = mgr.save(state, step=i)
        saves.append(time.perf_counter() - t)
        hvd.barrier()
        t = time.perf_counter()
        ckpt = mgr.restore()
        load_training_state(ckpt, model, opt)
        restores.append(time.perf_counter() - t)
    if hvd.rank() == 0:
        params = model.count_params()
        print(f"ResNet-50 {params / 1e6:.1f} M params, {len(model.variables)} model + "
              f"{len(opt.variables)} optimizer variables, "
              f"file {os.path.getsize(path) / 1e6:.0f} MB, {hvd.size()} rank(s)")
        print(f"  save (gather state + write + fsync + rename): best {min(saves):.2f} s, "
              f"median {np.median(saves):.2f} s")
        print(f"  restore (read + verify + broadcast + assign): best {min(restores):.2f} s, "
              f"median {np.median(restores):.2f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("reader")
    a.add_argument("--file", required=True, help="HDF5 from hpcrep data convert --fashion-mnist")
    a.add_argument("--batch", type=int, default=128)
    b = sub.add_parser("checkpoint")
    b.add_argument("--dir", required=True)
    b.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    {"reader": reader, "checkpoint": checkpoint}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
