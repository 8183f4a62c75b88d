"""A job that allreduces 1 MB in a ``tf.function`` again and again, until it is stopped.

    allreduce_loop.py PROGRESS

Each rank writes ``<pid> <steps done>`` to ``PROGRESS.<rank>`` after every step and checks each
sum (every element is the number of ranks). Run by the cut-link tests with a short
``HPCREP_STALL_TIMEOUT``: a cut link leaves the ranks blocked in the allreduce.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import tensorflow as tf

import hpcrep.tensorflow as hvd


def main() -> int:
    progress = sys.argv[1]
    hvd.init()
    ones = tf.ones([256 * 1024], tf.float32)  # 1 MB

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(x, op=hvd.Sum, name="loop.grad")

    done = 0
    while True:
        total = step(ones).numpy()
        if not np.all(total == hvd.size()):
            raise AssertionError(f"rank {hvd.rank()}: step {done}: wrong sum {total[:4]}")
        done += 1
        with open(f"{progress}.{hvd.rank()}.tmp", "w") as f:
            f.write(f"{os.getpid()} {done}\n")
        os.replace(f"{progress}.{hvd.rank()}.tmp", f"{progress}.{hvd.rank()}")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
