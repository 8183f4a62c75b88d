"""The mismatch check's messages and entries, branch by branch: the gaps mutation testing found.

`make mutation` showed that the message test beside these (test_fusion_and_check.py) covers one
branch of :func:`hpcrep.comm.check.mismatch_message` (a shape that differs), so a message that
lost its advice, named the wrong branch or mislabelled a single rank went unnoticed, and that
:func:`~hpcrep.comm.check.entries` (the first dimension left free for allgather) had no
one-process test at all. The check across real ranks is tests/launch/test_mutation_gaps_agree.py.
"""

import numpy as np
import pytest

from hpcrep.comm import check
from hpcrep.errors import CollectiveMismatchError

FIX = ("Every rank must call the same collectives in the same order, with tensors of the same "
       "dtype and shape (for allgather and alltoall, all but the first dimension).")


def sig(kind="allreduce", params=("Sum",), *entries):
    return (kind, params, tuple(entries) or (("w", "float32", (3,)),))


def test_different_collectives_are_named_with_the_ranks_that_called_each():
    msg = check.mismatch_message([sig(), sig("broadcast"), sig()])
    assert msg == ("ranks called different collectives at the same point: ranks 0, 2 passed "
                   f"allreduce; rank 1 passed broadcast. {FIX}")


def test_different_parameters_are_named():
    msg = check.mismatch_message([sig(params=("Sum",)), sig(params=("Max",))])
    assert msg == (f"hpcrep.allreduce: ranks disagree on parameters: rank 0 passed ('Sum',); "
                   f"rank 1 passed ('Max',). {FIX}")


def test_different_numbers_of_tensors_list_each_ranks_tensors():
    one = sig("allreduce", (), ("a", "float32", (2,)))
    two = sig("allreduce", (), ("a", "float32", (2,)), ("b", "int64", ()))
    msg = check.mismatch_message([one, two, two])
    assert msg == ("hpcrep.allreduce: ranks passed different numbers of tensors: rank 0 passed "
                   "1 tensor(s); ranks 1, 2 passed 2 tensor(s). Tensors by rank: rank 0 passed "
                   f"'a'; ranks 1, 2 passed 'a', 'b'. {FIX}")


def test_the_first_differing_tensor_is_named_with_its_position_and_free_dimensions():
    a = sig("allgather", (), ("x", "float32", (-1, 4)), ("y", "float32", (-1, 2)))
    b = sig("allgather", (), ("x", "float32", (-1, 4)), ("y", "float32", (-1, 3)))
    msg = check.mismatch_message([a, b])
    assert msg == ("hpcrep.allgather: ranks disagree on tensor 'y' (position 1 of 2): rank 0 "
                   f"passed float32[*, 2]; rank 1 passed float32[*, 3]. {FIX}")


def test_a_tensor_named_differently_on_a_rank_shows_that_ranks_name():
    a = sig("allreduce", (), ("w", "float32", (3,)))
    b = sig("allreduce", (), ("v", "float64", (3,)))
    msg = check.mismatch_message([a, b])
    assert "ranks disagree on tensor 'w' (position 0 of 1)" in msg  # rank 0's name
    assert "rank 0 passed float32[3]; rank 1 passed 'v' float64[3]" in msg


def test_signatures_that_differ_only_in_names_get_the_general_message():
    a = sig("allreduce", (), ("w", "float32", (3,)))
    b = sig("allreduce", (), ("v", "float32", (3,)))
    assert check.mismatch_message([a, b]) == (
        f"hpcrep.allreduce: ranks disagree on the call signature. {FIX}")


@pytest.mark.parametrize("shape, text", [((), "float32[]"), ((0, 1), "float32[0, 1]"),
                                         ((-1, 5), "float32[*, 5]"), ((7,), "float32[7]")])
def test_describe(shape, text):
    assert check.describe(("n", "float32", shape)) == text


def test_entries_free_only_the_first_dimension_and_only_when_asked():
    arrays = [np.zeros((4, 3), np.float32), np.zeros((), np.int64), np.zeros((2, 5, 6), np.int8)]
    names = ["a", "b", "c"]
    assert check.entries(arrays, names) == (("a", "float32", (4, 3)), ("b", "int64", ()),
                                            ("c", "int8", (2, 5, 6)))
    assert check.entries(arrays, names, free_first_dim=True) == (
        ("a", "float32", (-1, 3)), ("b", "int64", ()), ("c", "int8", (-1, 5, 6)))
    assert check.entries([], []) == ()


def test_hash_is_a_62_bit_value_that_ignores_names_only():
    base = sig("allreduce", ("Sum",), ("x", "float32", (3,)))
    h = check.signature_hash(base)
    assert 0 <= h < 2 ** 62 and h == check._signature_hash(base)
    for other in (sig("allgather", ("Sum",), ("x", "float32", (3,))),
                  sig("allreduce", ("Max",), ("x", "float32", (3,))),
                  sig("allreduce", ("Sum",), ("x", "float64", (3,)))):
        assert check.signature_hash(other) != h
    assert check.signature_hash(sig("allreduce", ("Sum",), ("renamed", "float32", (3,)))) == h


def test_agree_on_one_rank_passes_and_returns_nothing():
    from mpi4py import MPI

    assert check.agree(MPI.COMM_SELF, sig()) is None
    assert issubclass(CollectiveMismatchError, ValueError)
