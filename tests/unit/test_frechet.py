"""The Frechet distance (bench/frechet.py) on Gaussians whose distance is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from bench.frechet import frechet_distance, frechet_distance_of, gaussian_statistics


def random_rotation(d: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def random_spd(d: int, rng: np.random.Generator) -> np.ndarray:
    a = rng.normal(size=(d, d))
    return a @ a.T / d + 0.1 * np.eye(d)


def test_one_dimension_is_mean_gap_plus_std_gap():
    # N(m1, s1^2) vs N(m2, s2^2): d^2 = (m1 - m2)^2 + (s1 - s2)^2.
    assert frechet_distance([1.0], [[4.0]], [-2.0], [[9.0]]) == pytest.approx(9.0 + 1.0)


def test_commuting_covariances_reduce_to_square_root_gaps():
    # Covariances sharing eigenvectors Q: d^2 = |mu1 - mu2|^2 + sum (sqrt(a_i) - sqrt(b_i))^2.
    rng = np.random.default_rng(0)
    d = 16
    q = random_rotation(d, rng)
    a, b = rng.uniform(0.1, 5.0, d), rng.uniform(0.1, 5.0, d)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    got = frechet_distance(mu1, q @ np.diag(a) @ q.T, mu2, q @ np.diag(b) @ q.T)
    assert got == pytest.approx(expected, rel=1e-9)


def test_general_covariances_match_eigenvalues_of_the_product():
    # tr((S1 S2)^(1/2)) is the sum of square roots of the (real, non-negative) eigenvalues of the
    # non-symmetric product S1 S2: an independent route to the same number.
    rng = np.random.default_rng(1)
    d = 12
    s1, s2 = random_spd(d, rng), random_spd(d, rng)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    eig = np.linalg.eigvals(s1 @ s2)
    assert np.max(np.abs(eig.imag)) < 1e-9
    expected = (np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2)
                - 2 * np.sum(np.sqrt(eig.real)))
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-9)
    # A distance: symmetric, zero on itself, positive between different Gaussians.
    assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(expected, rel=1e-9)
    assert frechet_distance(mu1, s1, mu1, s1) == pytest.approx(0.0, abs=1e-9)
    assert expected > 0.1


def test_singular_covariances_give_a_real_finite_distance():
    # Rank-deficient covariances (fewer samples than features) must not produce NaN or complex.
    rng = np.random.default_rng(2)
    f1, f2 = rng.normal(size=(5, 20)), rng.normal(size=(5, 20)) + 3.0
    got = frechet_distance_of(f1, f2)
    assert np.isfinite(got) and got > 20 * 9 * 0.5


def test_samples_estimate_the_known_distance():
    # 20k draws from N(0, I) and N(mu, 4I) in 8-D: d^2 = |mu|^2 + 8 (2 - 1)^2.
    rng = np.random.default_rng(3)
    mu = np.full(8, 0.5)
    f1 = rng.normal(size=(20000, 8))
    f2 = mu + 2.0 * rng.normal(size=(20000, 8))
    assert frechet_distance_of(f1, f2) == pytest.approx(2.0 + 8.0, rel=0.03)


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="covariances"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="n >= 2"):
        gaussian_statistics(np.zeros((1, 4)))
