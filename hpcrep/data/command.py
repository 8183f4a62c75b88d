"""``hpcrep data convert``: numpy arrays or Fashion-MNIST to HDF5 chunked for the shard reader.

    hpcrep data convert --fashion-mnist -o fmnist.h5
    hpcrep data convert arrays.npz more.npy -o data.h5 --chunk-rows 128 --shuffle 0
"""

from __future__ import annotations

import argparse
import sys

from hpcrep.data.convert import load_arrays, write_hdf5
from hpcrep.data.mnist import FASHION_MNIST_DIR, load_fashion_mnist
from hpcrep.errors import DataError


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``data`` subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="data_command", required=True)
    c = sub.add_parser("convert", help="write .npz/.npy arrays or Fashion-MNIST to chunked HDF5")
    c.add_argument("inputs", nargs="*", help=".npz or .npy files")
    c.add_argument("--fashion-mnist", nargs="?", const=FASHION_MNIST_DIR, metavar="DIR",
                   help=f"convert Fashion-MNIST's IDX files (default {FASHION_MNIST_DIR})")
    c.add_argument("-o", "--output", required=True, help="the HDF5 file to write")
    c.add_argument("--chunk-rows", type=int, default=256, help="rows per chunk (use the batch)")
    c.add_argument("--shuffle", type=int, metavar="SEED", help="permute rows once with SEED")
    c.add_argument("--compression", choices=["gzip", "lzf"], help="chunk compression")


def main(args: argparse.Namespace) -> int:
    """Run ``hpcrep data convert``; print what was written."""
    try:
        arrays = {}
        if args.fashion_mnist:
            arrays.update(load_fashion_mnist(args.fashion_mnist))
        for path in args.inputs:
            arrays.update(load_arrays(path))
        if not arrays:
            raise DataError("nothing to convert: give .npz/.npy files or --fashion-mnist")
        if args.shuffle is not None and args.fashion_mnist:
            raise DataError("--shuffle needs equal row counts; Fashion-MNIST's train and test "
                            "splits differ: convert without --shuffle")
        write_hdf5(args.output, arrays, args.chunk_rows, args.shuffle, args.compression)
    except (DataError, OSError, ValueError) as exc:
        print(f"hpcrep data convert: {exc}", file=sys.stderr)
        return 2
    for key, a in arrays.items():
        print(f"{args.output}:{key} {a.dtype} {a.shape}")
    return 0
