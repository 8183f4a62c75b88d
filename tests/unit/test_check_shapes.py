"""The mismatch check tells shapes apart, not only element counts, without MPI.

Every rank hashes what it is about to do; a hash of (dtype, element count) would give [2, 3] and
[3, 2] the same value and let a transposed tensor through silently.
tests/mpi/test_mismatch_shapes.py runs the same cases across ranks on every path.
"""

from hpcrep.comm import check


def sig(*shapes):
    return ("allreduce", ("Sum",), tuple((f"t{i}", "float32", s) for i, s in enumerate(shapes)))


def test_hash_tells_transposed_shapes_apart():
    assert check.signature_hash(sig((2, 3))) != check.signature_hash(sig((3, 2)))
    assert check.signature_hash(sig((6,))) != check.signature_hash(sig((2, 3)))
    assert check.signature_hash(sig((4,), (2, 3))) != check.signature_hash(sig((4,), (3, 2)))
    assert check.signature_hash(sig((2, 3))) == check.signature_hash(sig((2, 3)))


def test_message_names_both_shapes():
    msg = check.mismatch_message([sig((4,), (2, 3)), sig((4,), (3, 2)), sig((4,), (3, 2))])
    assert "tensor 't1' (position 1 of 2)" in msg, msg
    assert "rank 0 passed float32[2, 3]" in msg and "ranks 1, 2 passed float32[3, 2]" in msg, msg
