"""Every HPCREP_* variable is checked at once, before MPI and TensorFlow start: a misspelt name
is named with the setting it was probably meant to be, a value that does not parse or is out of
range is one line that says what was expected, legal special values (0: off, auto, none) pass,
every name the checkout uses is a setting or a tool's variable, and rank 0 finds a directory
setting it cannot write before training."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

import hpcrep.comm as hc
from hpcrep import config, config_check
from hpcrep.errors import ConfigError, SettingsError

ROOT = Path(__file__).resolve().parents[2]
FIX = "Set a legal value, or unset it for the default"


def one(environ: dict) -> str:
    """The only problem :func:`config_check.problems` finds in ``environ``."""
    found = config_check.problems(environ)
    assert len(found) == 1, found
    return found[0]


def test_a_misspelt_name_is_reported_with_the_setting_it_was_meant_to_be():
    line = one({"HPCREP_FUSION_TRESHOLD": "1MiB"})
    assert line.startswith("HPCREP_FUSION_TRESHOLD is not an hpcrep setting (did you mean "
                           "HPCREP_FUSION_THRESHOLD?), so it would be ignored."), line
    assert "python -m hpcrep.config" in line
    assert "did you mean HPCREP_STALL_TIMEOUT?" in one({"HPCREP_STAL_TIMEOUT": "5"})
    assert "did you mean HPCREP_CHECKPOINT_DIR?" in one({"HPCREP_checkpoint_dir": "/x"})
    nothing_close = one({"HPCREP_BANANA": "1"})
    assert "is not an hpcrep setting, so" in nothing_close and "did you mean" not in nothing_close


@pytest.mark.parametrize("name, raw, words", [
    ("HPCREP_STALL_TIMEOUT", "-5", "is out of range: expected a finite number of seconds >= 0 "
                                   "(0: off); got -5.0."),
    ("HPCREP_STALL_TIMEOUT", "nan", "is out of range: expected a finite number of seconds >= 0 "
                                    "(0: off); got nan."),
    ("HPCREP_STALL_TIMEOUT", "inf", "is out of range"),
    ("HPCREP_STALL_TIMEOUT", "-inf", "is out of range"),
    ("HPCREP_STALL_TIMEOUT", "abc", "does not parse: expected a finite number of seconds >= 0 "
                                    "(0: off); got 'abc'."),
    ("HPCREP_MATCH_TIMEOUT", "0", "is out of range: expected a finite number of seconds > 0"),
    ("HPCREP_ULFM_DETECT_TIMEOUT", "-1", "is out of range"),
    ("HPCREP_LAUNCHER_GRACE", "nan", "is out of range"),
    ("HPCREP_STRAGGLER_SHARE", "1.5", "is out of range: expected a finite share > 0 and <= 1"),
    ("HPCREP_STRAGGLER_SHARE", "0", "is out of range"),
    ("HPCREP_FUSION_THRESHOLD", "-1", "is out of range: expected a byte count >= 0"),
    ("HPCREP_FUSION_THRESHOLD", "lots", "does not parse: expected a byte count"),
    ("HPCREP_ALLREDUCE_CHUNK", "1e999", "does not parse: expected a byte count >= 0"),
    ("HPCREP_THREADS", "1.5", "does not parse: expected a whole number >= 0 (0: automatic)"),
    ("HPCREP_THREADS", "-2", "is out of range: expected a whole number >= 0"),
    ("HPCREP_CHECKPOINT_KEEP", "0", "is out of range: expected a whole number >= 1"),
    ("HPCREP_AUTOTUNE_STEPS", "0", "is out of range: expected a whole number >= 1"),
    ("HPCREP_ELASTIC_MIN_NP", "0", "is out of range"),
    ("HPCREP_CHECK_REPLICAS", "-1", "does not parse: expected a number of steps >= 0"),
    ("HPCREP_NATIVE", "sometimes", "does not parse: expected auto, on or off; got 'sometimes'"),
    ("HPCREP_OVERLAP", "maybe", "does not parse: expected one of 1/0"),
    ("HPCREP_LOG_LEVEL", "loud", "is out of range: expected debug, info, warning or error"),
    ("HPCREP_COMPRESSION", "powersgd:0", "does not parse"),
    ("HPCREP_TIMELINE_STEPS", "5:2", "does not parse"),
])
def test_a_bad_value_is_one_line_saying_what_was_expected(name, raw, words):
    line = one({name: raw})
    assert line.startswith(f"{name}={raw!r} "), line
    assert words in line and FIX in line, line
    assert "\n" not in line


@pytest.mark.parametrize("name, raw", [
    ("HPCREP_STALL_TIMEOUT", "0"), ("HPCREP_STALL_TIMEOUT", "0.5"),
    ("HPCREP_LAUNCHER_GRACE", "0"), ("HPCREP_ULFM_DETECT_TIMEOUT", "0"),
    ("HPCREP_FUSION_THRESHOLD", "0"), ("HPCREP_FUSION_THRESHOLD", "64MiB"),
    ("HPCREP_ALLREDUCE_CHUNK", "200"), ("HPCREP_CHECK_REPLICAS", "0"),
    ("HPCREP_FLIGHT_RECORDER", "0"), ("HPCREP_STRAGGLER_WINDOW", "0"),
    ("HPCREP_STRAGGLER_SHARE", "1"), ("HPCREP_STRAGGLER_MIN_LATE", "0"),
    ("HPCREP_NATIVE", "off"), ("HPCREP_NATIVE", "AUTO"), ("HPCREP_NATIVE_SPIN_US", "0"),
    ("HPCREP_PARAM_STORE", "p2p"), ("HPCREP_THREADS", "0"), ("HPCREP_INTER_OP_THREADS", "0"),
    ("HPCREP_AUTOTUNE_WARMUP", "0"), ("HPCREP_ELASTIC_MAX_NP", "0"),
    ("HPCREP_ELASTIC_BATCHES_PER_COMMIT", "0"), ("HPCREP_CHECK_COLLECTIVES", "off"),
    ("HPCREP_OVERLAP", ""), ("HPCREP_COMPRESSION", "none"), ("HPCREP_COMPRESSION", "powersgd:2:3"),
    ("HPCREP_TIMELINE_STEPS", ""), ("HPCREP_TIMELINE_STEPS", "3:"), ("HPCREP_TF_LOG", "all"),
    ("HPCREP_LOG_LEVEL", "DEBUG"), ("HPCREP_TIMELINE", ""),
    ("HPCREP_CHECK_REPLICAS_ACTION", "Abort"),
])
def test_legal_special_values_pass(name, raw):
    assert config_check.problems({name: raw}) == []


def test_every_default_passes():
    assert config_check.problems({}) == []
    for s in config.SETTINGS.values():
        assert s.legal is None or s.legal.holds(s.default), s.name
        if isinstance(s.default, (bool, int, float, str)):  # as text, the way a user spells it
            text = str(int(s.default)) if isinstance(s.default, bool) else str(s.default)
            assert config_check.problems({s.name: text}) == [], s.name


def test_every_problem_is_found_at_once_in_name_order():
    found = config_check.problems({"HPCREP_STALL_TIMEOUT": "-5", "HPCREP_FUSION_TRESHOLD": "1",
                                   "HPCREP_MATCH_TIMEOUT": "abc", "PATH": "/bin"})
    assert [line.split("=")[0].split()[0] for line in found] == [
        "HPCREP_FUSION_TRESHOLD", "HPCREP_MATCH_TIMEOUT", "HPCREP_STALL_TIMEOUT"]


def _names_used(root: Path) -> set[str]:
    """Every HPCREP_ name in the checkout's code, scripts and docs (not the compiled op's C++
    macros, not tests/unit, which spells wrong names on purpose)."""
    found: set[str] = set()
    places = [root / d for d in ("hpcrep", "tests", "bench", "jobs", "slurm", "tools", "docs",
                                 ".ci")] + [root / "Makefile", root / "README.md"]
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in (".cc", ".h", ".so", ".pyc") or "unit" in path.parts:
                continue
            found |= set(re.findall(r"\bHPCREP_[A-Z0-9_]*[A-Z0-9]\b",
                                    path.read_text(errors="replace")))
    return found


def test_every_name_the_checkout_uses_is_a_setting_or_a_tools_variable():
    # HPCREP_ROOT is a Python constant of a test (the checkout's root), not a variable; the
    # misspelt name is the example of docs/operations.md and tests/launch/test_settings_check.py
    used = _names_used(ROOT) - {"HPCREP_ROOT", "HPCREP_FUSION_TRESHOLD"}
    assert "HPCREP_GROW_CHILD" in used and "HPCREP_CLUSTER_DIR" in used  # the scan sees them
    unknown = sorted(used - set(config.SETTINGS) - set(config.TOOL_VARIABLES))
    assert unknown == [], unknown
    assert config_check.problems(dict.fromkeys(config.TOOL_VARIABLES, "x")) == []
    assert config_check.problems({"HPCREP_GROW_CHILD": "1"}) == []  # set by grow on spawned ranks


def test_the_rank_comes_from_the_launcher_before_mpi_starts():
    assert config_check.launcher_rank({}) == 0
    assert config_check.launcher_rank({"OMPI_COMM_WORLD_RANK": "3", "SLURM_PROCID": "0"}) == 3
    assert config_check.launcher_rank({"PMI_RANK": "2"}) == 2
    assert config_check.launcher_rank({"SLURM_PROCID": "5"}) == 5


def test_rank_0_creates_a_missing_directory_and_reports_one_it_cannot_write(tmp_path):
    missing = tmp_path / "a" / "checkpoints"
    assert config_check.all_problems({"HPCREP_CHECKPOINT_DIR": str(missing)}) == []
    assert missing.is_dir()
    a_file = tmp_path / "file"
    a_file.write_text("")
    found = config_check.all_problems({"HPCREP_CHECKPOINT_DIR": str(a_file),
                                       "HPCREP_ELASTIC_DIR": str(a_file / "under")})
    assert len(found) == 2, found
    assert found[0].startswith(f"HPCREP_CHECKPOINT_DIR={str(a_file)!r} cannot be used: it "
                               "exists and is not a directory; rank 0 saves checkpoints there. "
                               "Point it at a directory"), found[0]
    assert found[1].startswith(f"HPCREP_ELASTIC_DIR={str(a_file / 'under')!r} cannot be used: "
                               "this process cannot write there (Not a directory)"), found[1]
    assert "unset it to keep commits in memory only" in found[1]
    # other ranks leave the directory to rank 0 (it may be on rank 0's node only)
    assert config_check.all_problems({"HPCREP_CHECKPOINT_DIR": str(a_file),
                                      "OMPI_COMM_WORLD_RANK": "1"}) == []


def test_a_read_only_directory_is_reported(tmp_path):
    read_only = Path("/sys/hpcrep-checkpoints")  # sysfs: root cannot create there either
    found = config_check.directory_problems({"HPCREP_CHECKPOINT_DIR": str(read_only)})
    if not found:
        pytest.skip("missing: a file system this process cannot write (/sys)")
    assert "cannot be used: this process cannot write there (" in found[0], found


def test_exit_on_problems_prints_one_prefixed_line_each_and_exits_2(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with pytest.raises(SystemExit) as exited:
        config_check.exit_on_problems({"HPCREP_STALL_TIMEOUT": "-5", "HPCREP_FUSION_TRESHOLD": "1"})
    assert exited.value.code == 2
    lines = sys.stderr.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("hpcrep: HPCREP_") for line in lines), lines
    config_check.exit_on_problems({"HPCREP_STALL_TIMEOUT": "5"})  # nothing wrong: returns


def test_init_raises_one_settings_error_listing_every_problem_before_mpi(monkeypatch):
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", "-5")
    monkeypatch.setenv("HPCREP_FUSION_TRESHOLD", "1MiB")
    monkeypatch.setattr("hpcrep.comm.world._mpi", lambda: pytest.fail("MPI was started"))
    with pytest.raises(SettingsError) as raised:
        hc.init()
    assert isinstance(raised.value, ConfigError)
    assert len(raised.value.problems) == 2
    for line in raised.value.problems:
        assert line in str(raised.value)
    assert "did you mean HPCREP_FUSION_THRESHOLD?" in str(raised.value)
    assert not hc.is_initialized()


def test_a_missing_elastic_dir_is_made_private_as_the_commit_would_make_it(tmp_path):
    """The start-up check creates HPCREP_ELASTIC_DIR before any commit does; it must not leave
    a directory others may write, from which a later resume would refuse the commit."""
    elastic, checkpoints = tmp_path / "elastic", tmp_path / "ckpt"
    assert config_check.directory_problems({"HPCREP_ELASTIC_DIR": str(elastic),
                                            "HPCREP_CHECKPOINT_DIR": str(checkpoints)}) == []
    assert elastic.stat().st_mode & 0o777 == 0o700
    assert checkpoints.is_dir()
