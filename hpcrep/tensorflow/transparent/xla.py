"""No XLA under transparent mode: both ways a script asks for it are turned off.

hpcrep's collectives run in ``tf.numpy_function``, which XLA cannot compile (outside transparent
mode :mod:`hpcrep.tensorflow.bridge` raises an error saying so). A script can ask for XLA in two
places, and each is patched here:

- ``Model.compile(jit_compile=...)``: always ``False``, including Keras's default ``"auto"``,
  which picks XLA when it can and would then fail at the first distributed step;
- ``tf.function(jit_compile=True)``: becomes ``jit_compile=False`` (other arguments unchanged).

A ``tf.function`` created before entering transparent mode keeps its setting.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import tensorflow as tf

from hpcrep.tensorflow.transparent.patching import PatchSet, bind, defining_class


def install(patches: PatchSet) -> None:
    """Patch ``keras.Model.compile`` and ``tf.function`` to compile without XLA. Local."""
    owner = defining_class(keras.Model, "compile")
    original_compile = vars(owner)["compile"]

    @functools.wraps(original_compile)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = bind(original_compile, self, args, kwargs)
        bound.arguments["jit_compile"] = False
        return original_compile(*bound.args, **bound.kwargs)

    original_function = tf.function

    @functools.wraps(original_function)
    def function(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("jit_compile"):
            kwargs["jit_compile"] = False
        return original_function(*args, **kwargs)

    patches.attr(owner, "compile", compile)
    patches.attr(tf, "function", function)
    patches.label("jit_compile=False (tf.function, Model.compile)")
