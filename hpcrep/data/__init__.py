"""Sharded HDF5 input (numpy + h5py).

The ``tf.data`` face is :mod:`hpcrep.tensorflow.hdf5_dataset`."""

from hpcrep.data.convert import load_arrays, load_fashion_mnist, read_idx, write_hdf5
from hpcrep.data.reader import HDF5ShardReader, Shard, block_order, shard_for

__all__ = ["HDF5ShardReader", "Shard", "shard_for", "block_order", "write_hdf5", "load_arrays",
           "load_fashion_mnist", "read_idx"]
