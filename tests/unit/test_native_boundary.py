"""The compiled path's boundary with Python: one numbering of reductions and of engine errors
on both sides, and errors mapped by their code, never by their text."""

from __future__ import annotations

import pytest
import tensorflow as tf

from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveMismatchError, JoinError
from hpcrep.tensorflow import fused, native
from hpcrep.tensorflow.native import library


def test_python_numbers_reductions_as_horovod_and_the_op_attribute_uses_them():
    assert [int(op) for op in library.REDUCE_OPS] == [0, 1, 3, 4, 5]
    assert {op.name for op in library.REDUCE_OPS} == {op.name for op in ReduceOp} - {"Adasum"}


def test_the_built_library_numbers_reductions_and_errors_as_python(skip_missing):
    loaded = native._load()
    if loaded.library is None:
        skip_missing(f"the compiled allreduce op: {loaded.reason}")
    assert loaded.library.numbering_mismatch() is None


def _error(kind, message: str = "ranks disagree") -> tf.errors.OpError:
    # as TensorFlow hands them over eagerly: bytes keys and values
    payloads = {} if kind is None else {native.PAYLOAD_KEY.encode(): str(int(kind)).encode()}
    return tf.errors.FailedPreconditionError(None, None, message, payloads)


@pytest.mark.parametrize("kind, expected", [(native.ErrorKind.MISMATCH, CollectiveMismatchError),
                                            (native.ErrorKind.JOIN, JoinError)])
def test_engine_errors_map_to_hpcrep_types_by_their_code(kind, expected):
    assert fused._error_kind(_error(kind)) is kind
    assert fused._ERRORS[fused._error_kind(_error(kind))] is expected


def test_an_error_without_the_code_is_not_recognised_by_its_text():
    old_prefix = "hpcrep collective mismatch: ranks disagree"
    assert fused._error_kind(_error(None, old_prefix)) is None
    assert fused._error_kind(_error(native.ErrorKind.MPI, old_prefix)) is native.ErrorKind.MPI
    unknown = tf.errors.InternalError(None, None, "x", {native.PAYLOAD_KEY.encode(): b"99"})
    assert fused._error_kind(unknown) is None
