"""Calling :mod:`hpcrep.comm` from TensorFlow, eagerly and inside ``tf.function``.

One ``tf.numpy_function`` call carries a whole group of tensors to the host, so a training step
pays the Python round trip (about 0.3 ms) once, not once per gradient. On the CPU, TensorFlow hands
the function numpy views of the input tensors (no copy) and takes back 64-byte-aligned numpy
arrays without copying them; :mod:`hpcrep.comm.fusion` returns exactly such arrays. The inputs
alias live tensors, so the functions called here must never write into them.

``tf.numpy_function`` is stateful, so ``tf.function``'s automatic control dependencies keep the
collectives of one function in program order on every rank; in a TF1 graph,
:mod:`hpcrep.tensorflow.graph_order` chains them in the order they were built. XLA cannot
compile it; see docs/design-notes.md ("XLA and jit_compile").
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from hpcrep.errors import HpcrepError
from hpcrep.tensorflow import graph_order
from hpcrep.tensorflow.errors import for_tensorflow


def _exclude_hpcrep_from_autograph() -> None:
    """Tell autograph not to convert hpcrep's own functions when a user's tf.function calls them.

    hpcrep's TensorFlow code is written graph-ready (explicit tf.cond, no Python control flow on
    tensors); converting it only costs trace time and makes autograph warn about mpi4py's
    compiled methods. Uses autograph's module rules, the mechanism it applies to TensorFlow itself.
    """
    try:
        from tensorflow.python.autograph.core import config as autograph_config  # noqa: PLC0415
    except ImportError:  # moved in a future TensorFlow: conversion still works, just noisier
        return
    autograph_config.CONVERSION_RULES = ((autograph_config.DoNotConvert("hpcrep"),)
                                         + tuple(autograph_config.CONVERSION_RULES))


_exclude_hpcrep_from_autograph()  # once, when bridge is first imported


def in_xla_context() -> bool:
    """Return True while tracing a function that XLA will compile (``jit_compile=True``)."""
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def require_no_xla(name: str) -> None:
    """Raise a clear error if collective ``name`` is being traced for XLA compilation.

    Checked at every world size, including 1 where no message is sent, so that a script that
    works on one rank does not fail only when scaled out. Local.
    """
    if in_xla_context():
        raise HpcrepError(
            f"hpcrep collective {name!r} is being compiled with XLA (jit_compile=True), which "
            "cannot call MPI. Compile the step without XLA: model.compile(..., "
            "jit_compile=False) or tf.function(jit_compile=False). "
            "hpcrep.tensorflow.transparent() does this for you.")


def host_call(fn: Callable[..., Sequence], tensors: Sequence[tf.Tensor],
              out_dtypes: Sequence[tf.DType], out_shapes: Optional[Sequence] = None,
              name: str = "hpcrep") -> list[tf.Tensor]:
    """Run ``fn(*arrays) -> list of arrays`` on the host and return its results as tensors.

    ``out_shapes`` (one ``tf.TensorShape`` or None per output) restores the static shapes that
    ``tf.numpy_function`` loses. hpcrep errors raised by ``fn`` arrive as their TensorFlow-typed
    subclasses (:mod:`hpcrep.tensorflow.errors`): eagerly as they are; in a graph or
    ``tf.function`` (where TensorFlow would map the exception by its Python base class only,
    a mismatch becoming ``InvalidArgumentError``) as the TensorFlow error of the same code,
    raised by the compiled library's ``HpcrepCheckHostStatus`` op from the code and message
    the host call returns (without the library: as TensorFlow maps them). Local; ``fn`` itself
    is usually collective.
    """
    require_no_xla(name)
    status_op = None if tf.executing_eagerly() or not out_dtypes else _host_status_op()

    def call(*arrays: Any) -> list:
        try:
            outs = list(fn(*arrays))
        except HpcrepError as error:
            converted = for_tensorflow(error)
            if status_op is not None and isinstance(converted, tf.errors.OpError):
                return [np.int32(converted.error_code), np.array(str(converted).encode()),
                        *(np.zeros(0, d.as_numpy_dtype) for d in out_dtypes)]
            if converted is error:
                raise
            raise converted from error
        return [np.int32(0), np.array(b""), *outs] if status_op is not None else outs

    def build() -> list[tf.Tensor]:
        if status_op is None:
            built = tf.numpy_function(call, list(tensors), list(out_dtypes), stateful=True,
                                      name=name)
            return list(built) if isinstance(built, (list, tuple)) else [built]
        code, message, *values = tf.numpy_function(
            call, list(tensors), [tf.int32, tf.string, *out_dtypes], stateful=True, name=name)
        return list(status_op(code, message, values))

    outs = graph_order.chained(build, lambda built: built[0].op)
    if out_shapes is not None:
        for t, shape in zip(outs, out_shapes):
            if shape is not None:
                t.set_shape(shape)
    return outs


def _host_status_op() -> Optional[Callable[..., Any]]:
    from hpcrep.tensorflow import native  # noqa: PLC0415 - native imports this module's users

    return native.host_status_op()
