"""PowerSGD's pure pieces: which gradients are compressed, the starting Q, the bytes sent, and the
``HPCREP_COMPRESSION`` setting (tests/mpi/test_powersgd.py runs the exchange itself)."""

import numpy as np
import pytest

from hpcrep import config
from hpcrep.errors import ConfigError


def test_a_matrix_is_compressed_only_where_factors_send_fewer_numbers():
    from hpcrep.tensorflow.powersgd import compresses, matrix_shape
    assert matrix_shape((3, 3, 16, 32)) == (144, 32)  # conv kernel: [kh*kw*cin, cout]
    assert compresses((3, 3, 16, 32), 4)               # 4 x 176 < 4608
    assert not compresses((32,), 1)                    # vectors never
    assert not compresses((4, 3), 2)                   # 2 x 7 = 14 >= 12
    assert compresses((4, 4), 1) and not compresses((4, 4), 2)  # 8 < 16; 16 >= 16
    assert not compresses((16, 5), 5) and not compresses((16, 5), 8)  # rank >= min(n, m)
    assert not compresses((None, 5), 1)


def test_starting_q_is_orthonormal_and_the_same_for_the_same_seed_and_matrix():
    from hpcrep.tensorflow.powersgd import starting_q
    q = starting_q(40, 4, seed=0, index=3)
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-12)
    np.testing.assert_array_equal(q, starting_q(40, 4, seed=0, index=3))
    assert not np.array_equal(q, starting_q(40, 4, seed=0, index=4))
    assert not np.array_equal(q, starting_q(40, 4, seed=1, index=3))


def test_bytes_per_step_counts_factors_for_matrices_and_everything_else_whole():
    import tensorflow as tf

    from hpcrep.tensorflow.compression import Compression
    shapes = [(3, 3, 16, 32), (32,), (4, 3), (100, 50)]
    variables = [tf.Variable(tf.zeros(s)) for s in shapes]
    sent, full = Compression.powersgd(2).bytes_per_step(variables)
    assert full == 4 * (4608 + 32 + 12 + 5000)
    assert sent == 4 * (2 * (144 + 32) + 32 + 12 + 2 * 150)


@pytest.mark.parametrize("text, value", [
    ("none", ("none", 0, 0)), ("FP16", ("fp16", 0, 0)), ("powersgd:2", ("powersgd", 2, 0)),
    ("powersgd:4:100", ("powersgd", 4, 100)), ("", ("none", 0, 0)),
])
def test_hpcrep_compression_parses(monkeypatch, text, value):
    monkeypatch.setenv("HPCREP_COMPRESSION", text)
    assert config.get("HPCREP_COMPRESSION") == value


@pytest.mark.parametrize("text", ["powersgd", "powersgd:0", "powersgd:x", "powersgd:2:-1",
                                  "topk:2", "fp16:2"])
def test_bad_hpcrep_compression_names_what_is_expected(monkeypatch, text):
    monkeypatch.setenv("HPCREP_COMPRESSION", text)
    with pytest.raises(ConfigError, match="powersgd:RANK"):
        config.get("HPCREP_COMPRESSION")
