"""Keras 3's mixed-precision recipe, 256 rows, where 40 rows that only the last rank trains on
overflow float16 (inputs x 6e4): the issue's scenario, run as a user would.

    mixed_precision_job.py --api transparent|compile|outer

``transparent``: the unchanged single-process script (run it under ``python -m hpcrep``);
``compile``: ``compile(hvd.DistributedOptimizer(SGD))``, which ``compile`` wraps in a
``LossScaleOptimizer``; ``outer``: ``hvd.DistributedOptimizer(LossScaleOptimizer(SGD))``. Every
rank prints ``weights-digest <sha256> scale <loss scale> iterations <n>`` on stderr.
"""

import argparse
import hashlib
import sys

import keras
import numpy as np

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--api", choices=["transparent", "compile", "outer"], required=True)
args = parser.parse_args()

keras.mixed_precision.set_global_policy("mixed_float16")
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = rng.normal(size=(256, 1)).astype("float32")

if args.api == "transparent":
    import hpcrep.comm as hc  # only to name the rank in the output: the training is unchanged

    size = hc.size()
    x[size - 1::size][:40] *= 6e4  # transparent fit gives the last rank rows size-1::size
    optimizer = keras.optimizers.SGD(0.01)
else:
    import hpcrep.tensorflow as hvd

    hvd.init()
    hc = hvd
    rank, size = hvd.rank(), hvd.size()
    x, y = x[rank::size], y[rank::size]  # the same rows per rank as transparent mode's
    if rank == size - 1:
        x[:40] *= 6e4
    sgd = keras.optimizers.SGD(0.01)
    optimizer = (hvd.DistributedOptimizer(sgd) if args.api == "compile" else
                 hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd)))

keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
model.compile(optimizer, "mse", jit_compile=False)
model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

opt = model.optimizer
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
print(f"rank {hc.rank()}: weights-digest {digest} scale {float(opt.dynamic_scale.numpy())} "
      f"iterations {int(opt.iterations.numpy())}", file=sys.stderr, flush=True)
