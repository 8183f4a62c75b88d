"""``bench.job.weights_agree`` (behind the convergence tests' "identical weights on every rank")
is true only when every rank holds the same bytes."""

import numpy as np
import pytest

from bench.job import weights_agree

pytestmark = pytest.mark.timeout(60)


def test_equal_weights_agree(world):
    rng = np.random.default_rng(3)
    weights = [rng.normal(size=(5, 4)).astype("float32"), rng.normal(size=4)]
    assert weights_agree(weights)


@pytest.mark.parametrize("change", ["permuted", "last_bit", "reshaped"])
def test_any_difference_on_one_rank_disagrees(world, change):
    r, n = world
    if n < 2:
        pytest.skip("a difference between ranks needs at least 2 ranks (this run has 1)")
    w = np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3)
    if r == n - 1:
        if change == "permuted":  # the same sum: a per-variable checksum cannot tell
            w = w[::-1].copy()
        elif change == "last_bit":  # 1 ulp: within any rtol
            w.view(np.int32)[0, 0] += 1
        else:  # the same bytes in another shape
            w = w.reshape(3, 2)
    assert not weights_agree([np.ones(3), w])
