"""Initialising a slice of a variable so that the sharded model equals the unsharded one.

Default (:func:`slice_initializer`): every rank draws the *full* variable from the layer's
initializer and keeps its slice. With the same seeds every rank draws the same full variable, and
the same one the unsharded layer would draw (same shape, so the same fans for Glorot/He, and the
same random numbers consumed from Keras's seed generator), so sharded and unsharded models start
equal. The price is one full draw per rank, at build time only.

For a table too big to draw whole on one rank, :class:`RowBlockInitializer` defines the table
block by block: rows ``[b * block_rows, (b + 1) * block_rows)`` are drawn from the base
initializer seeded with ``seed + b`` for a block of that shape, so a rank draws only the blocks
its rows touch, and the table is the same for any number of shards (and for a plain
``keras.layers.Embedding`` given the same initializer). A base initializer that depends on the
shape (Glorot, He: their fans) sees the block's shape, not the table's; Keras's Embedding default
(``"uniform"``) does not depend on it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from hpcrep.errors import ReplicatorError


def even_rows(total: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """Return ``(start, stop)`` of shard ``shard_index`` of ``total`` rows: equal parts, the
    first ``total % num_shards`` shards one row longer. Local."""
    base, extra = divmod(int(total), int(num_shards))
    start = shard_index * base + min(shard_index, extra)
    return start, start + base + (shard_index < extra)


def slice_initializer(initializer: Any, full_shape: Sequence[int], axis: int, start: int,
                      stop: int) -> Callable[..., tf.Tensor]:
    """Return an initializer that draws ``full_shape`` from ``initializer`` and keeps
    ``[start, stop)`` along ``axis`` (a :class:`RowBlockInitializer` along axis 0 draws only
    those rows). Local."""
    base = keras.initializers.get(initializer)
    full_shape = tuple(int(d) for d in full_shape)

    def draw(shape: Sequence[int], dtype: Optional[Any] = None) -> tf.Tensor:
        if isinstance(base, RowBlockInitializer) and axis == 0:
            return base.rows(start, stop, full_shape[1:], dtype)
        full = base(full_shape, dtype=dtype)
        index = [slice(None)] * len(full_shape)
        index[axis] = slice(start, stop)
        return full[tuple(index)]

    return draw


class RowBlockInitializer(keras.initializers.Initializer):
    """A table defined block by block of rows, so that a shard can draw only its own rows.

    Args:
        initializer: the base initializer of each block (a name or an initializer; default
            Keras's Embedding default, ``"uniform"``).
        block_rows: rows per block (the last block may be shorter).
        seed: block ``b`` is drawn with seed ``seed + b``.

    Raises:
        ReplicatorError: ``block_rows`` < 1, or a base initializer that cannot be seeded per
            block (a seeded Keras initializer takes a ``seed`` in its config).
    """

    def __init__(self, initializer: Any = "uniform", block_rows: int = 4096, seed: int = 0
                 ) -> None:
        if int(block_rows) < 1:
            raise ReplicatorError(f"block_rows must be >= 1, got {block_rows}")
        self.base = keras.initializers.get(initializer)
        self.block_rows = int(block_rows)
        self.seed = int(seed)
        config = self.base.get_config()
        if "seed" not in config and not isinstance(self.base, (keras.initializers.Zeros,
                                                               keras.initializers.Ones,
                                                               keras.initializers.Constant)):
            raise ReplicatorError(
                f"RowBlockInitializer seeds each block of {type(self.base).__name__}, which "
                "takes no seed; use a random initializer such as 'uniform' or RandomNormal")

    def _block(self, b: int, rows: int, tail: Sequence[int], dtype: Any) -> tf.Tensor:
        config = self.base.get_config()
        if "seed" in config:
            config["seed"] = self.seed + b
        return type(self.base).from_config(config)((rows, *tail), dtype=dtype)

    def rows(self, start: int, stop: int, tail: Sequence[int], dtype: Any = None) -> tf.Tensor:
        """Return rows ``[start, stop)`` of the table whose rows have shape ``tail``. Local."""
        n = self.block_rows
        parts = []
        for b in range(start // n, -(-stop // n)):
            lo, hi = b * n, (b + 1) * n
            block = self._block(b, n, tail, dtype)
            parts.append(block[max(start, lo) - lo:min(stop, hi) - lo])
        if not parts:
            return tf.zeros((0, *tail), dtype or "float32")
        return tf.concat(parts, axis=0)

    def __call__(self, shape: Sequence[int], dtype: Any = None) -> tf.Tensor:
        shape = tuple(int(d) for d in shape)
        return self.rows(0, shape[0], shape[1:], dtype)

    def get_config(self) -> dict:
        return {"initializer": keras.initializers.serialize(self.base),
                "block_rows": self.block_rows, "seed": self.seed}
