"""Settings that change which MPI calls a rank makes are compared once, at init, on every rank:
a difference raises ConfigError everywhere (never a hang), equal parsed values pass however they
are spelt. Meaningful at any world size: at one rank the spelling, invalid-value and no-hang parts
still run; the mismatch itself needs two ranks or more."""

import pytest

import hpcrep.comm as hc
from hpcrep.comm import world as comm_world
from hpcrep.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dup():
    """A duplicate of the job's communicator, freed afterwards (the check runs on it as on the
    communicator init() makes)."""
    comm = hc.comm().Dup()
    yield comm
    comm.Free()


def test_equal_parsed_values_agree_however_spelt(monkeypatch, world, dup):
    r, _ = world
    monkeypatch.setenv("HPCREP_ALLREDUCE_CHUNK", "2MiB" if r % 2 else "2097152")
    if r % 2:
        monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "16MiB")  # the default, spelt out
    else:
        monkeypatch.delenv("HPCREP_FUSION_THRESHOLD", raising=False)
    comm_world.check_settings(dup)  # no error on any rank


def test_a_rank_with_another_fusion_threshold_fails_on_every_rank(monkeypatch, world, dup):
    r, n = world
    if n < 2:
        pytest.skip("a mismatch needs two ranks")
    monkeypatch.delenv("HPCREP_FUSION_THRESHOLD", raising=False)
    if r == n - 1:
        monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "1MiB")
    with pytest.raises(ConfigError) as raised:
        comm_world.check_settings(dup)
    others = "rank 0: " if n == 2 else "ranks 0, 1: " if n == 3 else f"ranks 0-{n - 2}: "
    assert (f"HPCREP_FUSION_THRESHOLD differs between ranks ({others}16777216 (the default); "
            f"rank {n - 1}: 1048576)") in str(raised.value)
    assert "mpirun -x HPCREP_FUSION_THRESHOLD=" in str(raised.value)
    assert dup.allreduce(1) == n  # every rank left the check: the communicator still works


def test_a_bad_value_on_every_rank_raises_on_every_rank(monkeypatch, world, dup):
    _, n = world
    monkeypatch.setenv("HPCREP_NATIVE", "sometimes")
    with pytest.raises(ConfigError, match="HPCREP_NATIVE='sometimes' is invalid"):
        comm_world.check_settings(dup)
    assert dup.allreduce(1) == n


def test_a_bad_value_on_one_rank_raises_on_every_rank(monkeypatch, world, dup):
    r, n = world
    if r == n - 1:
        monkeypatch.setenv("HPCREP_OVERLAP", "maybe")
    else:
        monkeypatch.delenv("HPCREP_OVERLAP", raising=False)
    with pytest.raises(ConfigError, match="HPCREP_OVERLAP"):
        comm_world.check_settings(dup)
    assert dup.allreduce(1) == n
