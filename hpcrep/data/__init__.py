"""Input data: Fashion-MNIST (offline), sharded HDF5 (numpy + h5py; the ``tf.data`` face is
:mod:`hpcrep.tensorflow.hdf5_dataset`)."""

from hpcrep.data.convert import load_arrays, write_hdf5
from hpcrep.data.mnist import FASHION_MNIST_DIR, fashion_mnist_split, load_fashion_mnist, read_idx
from hpcrep.data.reader import HDF5ShardReader, Shard, block_order, shard_for

__all__ = ["HDF5ShardReader", "Shard", "shard_for", "block_order", "write_hdf5", "load_arrays",
           "FASHION_MNIST_DIR", "fashion_mnist_split", "load_fashion_mnist", "read_idx"]
