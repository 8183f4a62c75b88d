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
