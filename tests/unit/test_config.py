"""The settings table parses values and rejects bad ones with a useful message."""

import pytest

from hpcrep import config
from hpcrep.errors import ConfigError


def test_defaults_and_parsing(monkeypatch):
    monkeypatch.delenv("HPCREP_FUSION_THRESHOLD", raising=False)
    assert config.get("HPCREP_FUSION_THRESHOLD") == 16 << 20
    for text, value in [("4k", 4096), ("1MiB", 1 << 20), ("123", 123), ("0", 0)]:
        monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", text)
        assert config.get("HPCREP_FUSION_THRESHOLD") == value
    monkeypatch.setenv("HPCREP_CHECK_COLLECTIVES", "off")
    assert config.get("HPCREP_CHECK_COLLECTIVES") is False


def test_bad_value_names_setting_and_fix(monkeypatch):
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "lots")
    with pytest.raises(ConfigError, match="HPCREP_FUSION_THRESHOLD='lots' is invalid.*Unset it"):
        config.get("HPCREP_FUSION_THRESHOLD")
    with pytest.raises(ConfigError, match="unknown hpcrep setting"):
        config.get("HPCREP_NOPE")


def test_every_setting_documented():
    for s in config.SETTINGS.values():
        assert s.name.startswith("HPCREP_") and len(s.meaning) > 20


def test_settings_that_change_mpi_calls_must_agree():
    must = {s.name for s in config.SETTINGS.values() if s.same_on_all_ranks}
    assert {"HPCREP_FUSION_THRESHOLD", "HPCREP_ALLREDUCE_CHUNK", "HPCREP_NATIVE",
            "HPCREP_OVERLAP", "HPCREP_CHECK_COLLECTIVES",
            "HPCREP_HIERARCHICAL_ALLREDUCE"} <= must
    assert "HPCREP_STALL_TIMEOUT" not in must and "HPCREP_LOG_LEVEL" not in must


def test_agreed_values_compare_parsed_values_not_text(monkeypatch):
    monkeypatch.delenv("HPCREP_FUSION_THRESHOLD", raising=False)
    unset = config.agreed_values()
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "16MiB")  # the default, spelt out
    spelt = config.agreed_values()
    assert unset == spelt and config.digest(unset) == config.digest(spelt)
    assert config.disagreement([unset, spelt, unset]) == ""
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "1MiB")
    other = config.agreed_values()
    assert config.digest(other) != config.digest(unset)


def test_disagreement_names_setting_values_ranks_and_fix(monkeypatch):
    for s in config.SETTINGS.values():
        monkeypatch.delenv(s.name, raising=False)
    base = config.agreed_values()
    monkeypatch.setenv("HPCREP_FUSION_THRESHOLD", "1MiB")
    monkeypatch.setenv("HPCREP_OVERLAP", "0")
    odd = config.agreed_values()
    msg = config.disagreement([base, base, base, odd, base, base, odd])
    assert ("HPCREP_FUSION_THRESHOLD differs between ranks (ranks 0-2, 4, 5: 16777216 (the "
            "default); ranks 3, 6: 1048576)") in msg
    assert "HPCREP_OVERLAP differs between ranks (ranks 0-2, 4, 5: True (the default); " \
           "ranks 3, 6: False)" in msg
    assert "mpirun -x HPCREP_FUSION_THRESHOLD=<value>" in msg
    assert "HPCREP_ALLREDUCE_CHUNK" not in msg  # equal everywhere: not mentioned


def test_an_unparsable_value_is_compared_then_raised(monkeypatch):
    monkeypatch.delenv("HPCREP_ALLREDUCE_CHUNK", raising=False)
    good = config.agreed_values()
    monkeypatch.setenv("HPCREP_ALLREDUCE_CHUNK", "lots")
    bad = config.agreed_values()  # no raise: the other ranks must learn of it too
    assert "rank 1: 'lots' (invalid)" in config.disagreement([good, bad])
    config.require_valid(good)
    with pytest.raises(ConfigError, match="HPCREP_ALLREDUCE_CHUNK='lots' is invalid"):
        config.require_valid(bad)


def test_ranks_on_other_hpcrep_versions_disagree():
    values = config.agreed_values()
    assert "different versions of hpcrep" in config.disagreement([values, values[:-1]])
