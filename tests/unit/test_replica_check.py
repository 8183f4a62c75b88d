"""The replica canary's pieces that need no MPI: the per-variable checksum (bitwise: one flipped
bit shows, in every dtype the canary checks), its NaN/inf flag, the settings, and the report
text (who holds what)."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from hpcrep import config
from hpcrep.errors import ConfigError
from hpcrep.tensorflow.replica_check import checksum, nonfinite
from hpcrep.tensorflow.replica_report import (NON_TRAINABLE, OPTIMIZER, TRAINABLE, Entry,
                                              findings, holders)

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64, np.uint8]


def values(dtype):
    return (np.arange(1, 13).reshape(3, 4) * 3 - 7).astype(np.float64).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_checksum_is_the_wrapping_sum_of_the_bits(dtype):
    a = values(dtype)
    width = a.dtype.itemsize
    bits = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
    expected = int(bits.astype(np.uint64).sum(dtype=np.uint64))
    expected %= 2 ** (64 if width == 8 else 32)
    got = int(checksum(tf.constant(a)).numpy())
    assert got % 2 ** 64 == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_any_one_flipped_bit_changes_the_checksum(dtype):
    a = values(dtype)
    base = int(checksum(tf.constant(a)).numpy())
    width = a.dtype.itemsize
    for bit in range(8 * width):  # every bit of one element, the sign bit included
        b = a.copy()
        raw = b.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
        raw[1, 2] ^= raw.dtype.type(1) << raw.dtype.type(bit)
        assert int(checksum(tf.constant(b)).numpy()) != base, f"bit {bit}"


def test_checksum_works_inside_tf_function_on_a_variable():
    v = tf.Variable(values(np.float32))
    assert int(tf.function(lambda: checksum(v))().numpy()) == int(checksum(v).numpy())


def test_checksum_of_booleans_and_rejects_complex():
    assert int(checksum(tf.constant([True, False, True])).numpy()) == 2
    with pytest.raises(ValueError, match="complex64"):
        checksum(tf.constant([1 + 2j], tf.complex64))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_nonfinite_flags_nan_and_inf(dtype, bad):
    a = values(dtype)
    assert int(nonfinite(tf.constant(a)).numpy()) == 0
    a[0, 1] = bad
    assert int(nonfinite(tf.constant(a)).numpy()) == 1


def test_nonfinite_is_zero_for_integers():
    assert int(nonfinite(tf.constant(values(np.int32))).numpy()) == 0


def test_settings_parse(monkeypatch):
    assert config.get("HPCREP_CHECK_REPLICAS") == 100
    assert config.get("HPCREP_CHECK_REPLICAS_ACTION") == "warn"
    for text, value in (("0", 0), (" 25 ", 25)):
        monkeypatch.setenv("HPCREP_CHECK_REPLICAS", text)
        assert config.get("HPCREP_CHECK_REPLICAS") == value
    for text in ("-1", "often"):
        monkeypatch.setenv("HPCREP_CHECK_REPLICAS", text)
        with pytest.raises(ConfigError, match="HPCREP_CHECK_REPLICAS"):
            config.get("HPCREP_CHECK_REPLICAS")
    monkeypatch.setenv("HPCREP_CHECK_REPLICAS_ACTION", "Abort")
    assert config.get("HPCREP_CHECK_REPLICAS_ACTION") == "abort"
    monkeypatch.setenv("HPCREP_CHECK_REPLICAS_ACTION", "ignore")
    with pytest.raises(ConfigError, match="warn, abort or rebroadcast"):
        config.get("HPCREP_CHECK_REPLICAS_ACTION")
    assert config.SETTINGS["HPCREP_CHECK_REPLICAS"].same_on_all_ranks
    assert config.SETTINGS["HPCREP_CHECK_REPLICAS_ACTION"].same_on_all_ranks


def test_holders_groups_ranks_by_value():
    assert holders([5, 5, 5, 7], [0.0, 0.0, 0.0, 1e-3], [0, 1, 2, 3]) == \
        "ranks 0-2 agree, rank 3 differs, max |x - x[rank 0]| = 1.0e-03"
    assert holders([5, 7, 7, 9], [0.0, 2e-3, 2e-3, float("nan")], [0, 1, 2, 3]) == \
        ("rank 0 alone, ranks 1, 2 differ (holding one value), max |x - x[rank 0]| = 2.0e-03, "
         "rank 3 differs, max |x - x[rank 0]| = NaN")


def test_findings_separate_errors_from_what_may_differ():
    entries = [Entry("d/kernel", TRAINABLE), Entry("d/bias", TRAINABLE),
               Entry("SGD/iteration", OPTIMIZER), Entry("bn/moving_mean", NON_TRAINABLE)]
    found = findings(40, entries, [True, False, False, True],
                     {0: [1, 1, 2], 3: [4, 5, 6]}, {0: [0.0, 0.0, 1e-3]},
                     {0: [False, False, True]}, [0, 1, 2], "warn")
    assert found.diverged and found.differing == ("d/kernel",)
    assert found.meant_to_differ == ("bn/moving_mean",) and found.nonfinite == ("d/kernel",)
    assert found.lines[0] == (
        "hpcrep replica check, step 40: 1 of 2 trainable variables differ across ranks "
        "(action: warn): d/kernel: ranks 0, 1 agree, rank 2 differs, max |x - x[rank 0]| = "
        "1.0e-03")
    assert "information, not an error" in found.lines[1]
    assert found.lines[2].endswith("bn/moving_mean: rank 0 alone, rank 1 differs, rank 2 differs")
    assert found.lines[3].endswith("d/kernel holds NaN or inf on rank 2")
    quiet = findings(41, entries, [False, False, False, True], {3: [4, 5, 6]}, {}, {},
                     [0, 1, 2], "warn", show_meant_to_differ=False)
    assert not quiet.diverged and quiet.lines == ()
