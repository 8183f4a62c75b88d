"""Side effects on rank 0 only: printing, ``model.save`` and ``save_weights``; no XLA.

Saving runs without the variable-creation broadcast (rank 0 is alone). On other ranks ``sys.stdout`` goes to ``/dev/null`` (errors on ``sys.stderr`` still show).
``save``/``save_weights`` write on rank 0; outside ``fit`` (where every rank calls them) the ranks
then agree on the outcome, so the file exists when any rank returns and a failed save raises on
every rank. Inside ``fit`` the saving callbacks run on rank 0 alone, so there is no exchange.

``tf.function(jit_compile=True)`` becomes ``jit_compile=False``: hpcrep's collectives run in
``tf.numpy_function``, which XLA cannot compile.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm
from hpcrep.errors import RemoteError
from hpcrep.tensorflow.transparent.initial_values import local_only
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class
from hpcrep.tensorflow.transparent.training import in_keras_loop


def _agree_on_save(what: str, error: BaseException | None) -> None:
    """Raise ``error`` on rank 0 and a :class:`RemoteError` elsewhere if rank 0 failed. Collective."""
    failed = comm.broadcast(np.array([error is not None], np.int8), 0, name="save_outcome")[0]
    if error is not None:
        raise error
    if failed:
        raise RemoteError(f"rank 0 failed in {what}; see its traceback. This rank stops too.")


def _rank_zero_writer(original: Any, what: str) -> Any:
    @functools.wraps(original)
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        if in_keras_loop():
            if comm.rank() != 0:
                return None
            with local_only():
                return original(self, *args, **kwargs)
        result, error = None, None
        if comm.rank() == 0:
            try:
                with local_only():
                    result = original(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                error = exc
        _agree_on_save(what, error)
        return result

    return write


def install(patches: PatchSet) -> None:
    """Patch printing, saving and ``tf.function``. Local."""
    for name in ("save", "save_weights"):
        owner = defining_class(keras.Model, name)
        patches.attr(owner, name, _rank_zero_writer(vars(owner)[name], f"model.{name}"))
    patches.label("model.save/save_weights (rank 0 only)")

    if comm.rank() != 0:
        saved, devnull = sys.stdout, open(os.devnull, "w")  # noqa: SIM115 - closed on restore
        sys.stdout = devnull

        def restore_stdout() -> None:
            sys.stdout = saved
            devnull.close()

        patches.on_restore(restore_stdout)
    patches.label("printing (rank 0 only)")

    original_function = tf.function

    @functools.wraps(original_function)
    def function(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("jit_compile"):
            kwargs["jit_compile"] = False
        return original_function(*args, **kwargs)

    patches.attr(tf, "function", function)
    patches.label("jit_compile=False (tf.function, Model.compile)")
