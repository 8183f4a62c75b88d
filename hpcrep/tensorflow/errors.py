"""hpcrep's collective errors as TensorFlow error types, for ``except`` clauses written for Horovod.

Horovod's ops raise ``tf.errors.FailedPreconditionError`` when ranks pass mismatched shapes,
dtypes or ranks, and ``tf.errors.InvalidArgumentError`` for bad arguments such as alltoall splits.
The classes here derive from both hpcrep's error (so ``except CollectiveMismatchError`` and
``except ValueError`` keep working) and that TensorFlow type.
:func:`hpcrep.tensorflow.bridge.host_call` converts the errors raised on the host into them.

Inside ``tf.function`` and TF1 graphs TensorFlow would turn an exception raised by a host call
into an error chosen by its Python base class only (``ValueError`` becomes
``InvalidArgumentError``); :func:`hpcrep.tensorflow.bridge.host_call` returns the error as data
there and the compiled library's ``HpcrepCheckHostStatus`` op raises the TensorFlow error of the
same code (Horovod's ``FailedPreconditionError`` for a mismatch). Only where that library is not
built does a mismatch in a graph arrive as ``InvalidArgumentError``.
"""

from __future__ import annotations

import tensorflow as tf

from hpcrep.errors import CollectiveArgumentError, CollectiveMismatchError


class TFCollectiveMismatchError(CollectiveMismatchError, tf.errors.FailedPreconditionError):
    """Ranks disagree on a collective; also a ``tf.errors.FailedPreconditionError`` (Horovod's)."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)
        self.args = (message,)

    def __reduce__(self) -> tuple:
        return type(self), (self.message,)


class TFCollectiveArgumentError(CollectiveArgumentError, tf.errors.InvalidArgumentError):
    """A collective's argument is invalid; also a ``tf.errors.InvalidArgumentError`` (Horovod's)."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)
        self.args = (message,)

    def __reduce__(self) -> tuple:
        return type(self), (self.message,)


def for_tensorflow(error: BaseException) -> BaseException:
    """Return ``error`` as its TensorFlow-typed subclass, or unchanged if it has none."""
    if isinstance(error, (TFCollectiveMismatchError, TFCollectiveArgumentError)):
        return error
    if isinstance(error, CollectiveMismatchError):
        return TFCollectiveMismatchError(str(error))
    if isinstance(error, CollectiveArgumentError):
        return TFCollectiveArgumentError(str(error))
    return error
