"""hpcrep.comm.ulfm in one process: which errors count as a failed rank, and what happens where
the MPI has no ULFM (the project's .venv: Debian's Open MPI 4.1). The recovery itself, on Open MPI
5 with a rank SIGKILLed, is tests/launch/test_ulfm_shrink.py."""

from __future__ import annotations

import pytest

from hpcrep.comm import ulfm
from hpcrep.errors import FaultToleranceUnavailableError, HpcrepError

MPI = pytest.importorskip("mpi4py.MPI")


def _library_has_ulfm() -> bool:
    probe = MPI.COMM_SELF.Dup()
    try:
        probe.Revoke()  # mpi4py stands in for the other ULFM calls, never for this one
    except NotImplementedError:
        return False
    finally:
        probe.Free()
    return True


@pytest.mark.parametrize("name", ["ERR_PROC_FAILED", "ERR_REVOKED"])
def test_a_failed_or_revoked_peer_is_a_failure(name):
    assert ulfm.is_failure(MPI.Exception(getattr(MPI, name)))


@pytest.mark.parametrize("exc", [MPI.Exception(MPI.ERR_OTHER), MPI.Exception(MPI.ERR_TRUNCATE),
                                 ValueError("not MPI"), KeyboardInterrupt()])
def test_other_errors_are_not(exc):
    assert not ulfm.is_failure(exc)


def test_without_ulfm_has_ulfm_is_false_and_shrink_says_how_to_get_it():
    if _library_has_ulfm():
        pytest.skip("this Python's MPI has ULFM (run from .venv-ulfm): nothing to refuse here")
    assert not ulfm.has_ulfm()
    comm = MPI.COMM_SELF.Dup()
    try:
        with pytest.raises(FaultToleranceUnavailableError, match="make ulfm") as info:
            ulfm.shrink(comm, 3)
        assert isinstance(info.value, HpcrepError) and "--with-ft ulfm" in str(info.value)
    finally:
        comm.Free()
