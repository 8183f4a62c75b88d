"""Run a script under ``python -m hpcrep`` on one rank and record what the tests check.

    probe.py OUT script.py [args ...]

Each rank runs in its own working directory ``OUT/cwd<rank>`` (so files a rank writes with
relative paths show which rank wrote them) and, after a clean end, writes ``OUT/rank<rank>.json``
(fingerprints of the rows each training shard held, and of the whole input) and
``OUT/rank<rank>.npz`` (the final weights of every Keras model, in creation order).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

import numpy as np

import hpcrep.comm as hc


def rows_of(batches) -> list[str]:
    """Fingerprint each row of the first tensor of every batch."""
    out = []
    for batch in batches:
        first = np.asarray(batch[0] if isinstance(batch, (tuple, list)) else batch)
        out += [hashlib.md5(np.ascontiguousarray(row).tobytes()).hexdigest()[:16] for row in first]
    return out


def main() -> int:
    out, target = os.path.abspath(sys.argv[1]), sys.argv[2:]
    hc.init()
    rank = hc.rank()
    workdir = os.path.join(out, f"cwd{rank}")
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)

    import keras

    from hpcrep.__main__ import _transparent
    from hpcrep.launch import runner
    from hpcrep.tensorflow.transparent import sharding, state

    records: list[dict] = []
    original_arrays, original_dataset = sharding.shard_arrays, sharding.shard_dataset

    def shard_arrays(structures, rank, size, equal):
        result = original_arrays(structures, rank, size, equal)
        records.append({"kind": "arrays", "equal": equal, "full": rows_of([structures[0]]),
                        "mine": rows_of([result[0]])})
        return result

    def shard_dataset(ds, rank, size, equal, **kwargs):
        result = original_dataset(ds, rank, size, equal, **kwargs)
        with state.keras_loop():  # iterate without transparent mode's own sharding
            records.append({"kind": "dataset", "equal": equal, "full": rows_of(ds),
                            "mine": rows_of(result)})
        return result

    sharding.shard_arrays, sharding.shard_dataset = shard_arrays, shard_dataset
    models: list = []
    layer_init = keras.layers.Layer.__init__

    def track(self, *args, **kwargs):
        layer_init(self, *args, **kwargs)
        models.append(self)

    keras.layers.Layer.__init__ = track
    code = runner.main(target, context=functools.partial(_transparent, target))
    weights = {f"{i}_{j}": np.asarray(w) for i, m in enumerate(x for x in models
                                                               if isinstance(x, keras.Model))
               for j, w in enumerate(m.get_weights())}
    np.savez(os.path.join(out, f"rank{rank}.npz"), **weights)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(records, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
