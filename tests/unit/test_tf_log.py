"""HPCREP_TF_LOG decides TensorFlow's log level in what hpcrep launches; a level the user set
wins. (The real output of a launch, quiet and not: tests/launch/test_tf_log.py.)"""

import pytest

from hpcrep.errors import ConfigError
from hpcrep.launch import tf_log
from hpcrep.launch.mpirun import mpirun_env


@pytest.mark.parametrize("setting, level", [(None, "2"), ("quiet", "2"), ("all", "0"),
                                            (" ALL ", "0")])
def test_setting_picks_the_level_for_the_ranks(monkeypatch, setting, level):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    if setting is None:
        monkeypatch.delenv("HPCREP_TF_LOG", raising=False)
    else:
        monkeypatch.setenv("HPCREP_TF_LOG", setting)
    assert tf_log.set_tf_log_level({})["TF_CPP_MIN_LOG_LEVEL"] == level
    assert mpirun_env({"PATH": "/bin"})["TF_CPP_MIN_LOG_LEVEL"] == level


@pytest.mark.parametrize("setting", ["quiet", "all"])
def test_a_level_the_user_set_is_kept(monkeypatch, setting):
    monkeypatch.setenv("HPCREP_TF_LOG", setting)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    assert mpirun_env()["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert tf_log.set_tf_log_level({"TF_CPP_MIN_LOG_LEVEL": "3"})["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_a_bad_value_says_what_is_allowed(monkeypatch):
    monkeypatch.setenv("HPCREP_TF_LOG", "loud")
    with pytest.raises(ConfigError, match="HPCREP_TF_LOG='loud' is invalid: expected quiet or all"):
        tf_log.set_tf_log_level({})

