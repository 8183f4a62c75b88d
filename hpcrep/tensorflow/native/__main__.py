"""``python -m hpcrep.tensorflow.native``: say which allreduce path is active, and why."""

from hpcrep.tensorflow import native

print(native.status()[1])
