"""The key of one ``fit`` of a script: which checkpoints in ``HPCREP_CHECKPOINT_DIR`` are its own.

A script may call ``fit`` more than once (pre-training then fine-tuning, or two models). Each call
gets ``fit<N>-<fingerprint>``: ``N`` counts the script's ``fit`` calls in this run (1 for the
first), the fingerprint hashes the model's variables (paths, whole shapes, dtypes) and the
optimizer's class (and its inner optimizer's, for a wrapper such as ``LossScaleOptimizer``). A
rerun of the same script gives every ``fit`` the key it had, at any number of ranks (the shapes
of tensor-parallel variables are their whole shapes); another ``fit`` or another model gets
another key, so it never restores state that is not its own.
"""

from __future__ import annotations

import hashlib
from typing import Any

from hpcrep.tensorflow import sharded_variables


def fingerprint(model: Any, optimizer: Any = None) -> str:
    """Return 12 hex digits identifying ``model``'s variables and ``optimizer``'s class. Local."""
    variables = list(model.variables)
    specs, _ = sharded_variables.specs_of(variables)
    digest = hashlib.sha256()
    for variable, spec in zip(variables, specs):
        shape = tuple(variable.shape) if spec is None else spec.full_shape(variable.shape)
        path = getattr(variable, "path", variable.name)
        digest.update(f"{path}|{shape}|{variable.dtype}\n".encode())
    while optimizer is not None:
        digest.update(f"optimizer {type(optimizer).__qualname__}\n".encode())
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return digest.hexdigest()[:12]


def fit_key(ordinal: int, model: Any, optimizer: Any = None) -> str:
    """Return the key of the script's ``ordinal``-th ``fit`` of ``model``. Local."""
    return f"fit{int(ordinal)}-{fingerprint(model, optimizer)}"
