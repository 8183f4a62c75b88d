"""``hvd.load_model``: a saved Keras model whose optimizer comes back distributed.

Horovod's helper deserialises the optimizer through factory functions passed as custom objects;
Keras 3 builds an optimizer from its class's ``from_config``, so hpcrep loads the model as Keras
saved it and then wraps the loaded optimizer: a :func:`DistributedOptimizer` of the same class
and config, built on the model's trainable variables and given the loaded optimizer's state
(iteration count, slots, a loss scale), so training resumes where it was saved.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import keras

from hpcrep.errors import CheckpointError
from hpcrep.tensorflow.compression import Compression, Compressor
from hpcrep.tensorflow.optimizer import DistributedOptimizer, is_distributed


def load_model(filepath: Any, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[dict] = None,
               compression: type[Compressor] = Compression.none) -> keras.Model:
    """Load a saved Keras model (a ``.keras`` or ``.h5`` file) with its optimizer wrapped in
    :func:`~hpcrep.tensorflow.optimizer.DistributedOptimizer` (``compression`` passed on).

    Keras's optimizers need nothing; ``custom_optimizers`` (optimizer classes) and
    ``custom_objects`` are handed to ``keras.models.load_model``. Every rank reads the file
    itself, as in Horovod: put it where every rank can read it. The model's step is compiled
    without XLA (hpcrep's collectives are not XLA ops). A model saved without an optimizer
    (or uncompiled) is returned as loaded.

    Local (reads a file); the model then trains collectively.

    Raises:
        CheckpointError: the loaded optimizer's state does not fit the wrapped optimizer.
    """
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    loaded = getattr(model, "optimizer", None)
    if loaded is None or is_distributed(loaded):
        return model
    model.optimizer = _distributed_copy(loaded, model, compression)
    model.jit_compile = False
    return model


def _distributed_copy(loaded: keras.optimizers.Optimizer, model: keras.Model,
                      compression: type[Compressor]) -> keras.optimizers.Optimizer:
    """Return a DistributedOptimizer of ``loaded``'s class and config holding its state."""
    dist = DistributedOptimizer(loaded, compression=compression)
    if not loaded.built:
        return dist
    dist.build(model.trainable_variables)
    if len(dist.variables) != len(loaded.variables):
        raise CheckpointError(
            f"load_model: the saved {type(loaded).__name__} has {len(loaded.variables)} state "
            f"variables, its distributed copy {len(dist.variables)}; load the model with "
            "keras.models.load_model and wrap the optimizer with hvd.DistributedOptimizer.")
    for mine, saved in zip(dist.variables, loaded.variables):
        mine.assign(saved)
    return dist
