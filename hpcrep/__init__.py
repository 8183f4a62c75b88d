"""hpcrep: data-parallel TensorFlow training over MPI.

Importing :mod:`hpcrep` is cheap: it loads neither MPI nor TensorFlow. Use
:mod:`hpcrep.comm` for collectives on numpy arrays and :mod:`hpcrep.tensorflow` (Horovod-compatible,
``import hpcrep.tensorflow as hvd``) for tensors, optimizers and Keras.
"""

__version__ = "0.1.0"
