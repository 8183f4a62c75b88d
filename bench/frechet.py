"""Frechet distance between two Gaussians fitted to feature sets (the FID formula of Heusel et
al. 2017), in numpy alone (no scipy).

``d^2 = |mu_1 - mu_2|^2 + tr(S_1) + tr(S_2) - 2 tr((S_1^(1/2) S_2 S_1^(1/2))^(1/2))``

The trace term is computed without a general matrix square root: ``S_1^(1/2)`` of a symmetric
positive semi-definite matrix comes from ``eigh``, ``S_1^(1/2) S_2 S_1^(1/2)`` is again symmetric
PSD, and the trace of its square root is the sum of the square roots of its eigenvalues. This
equals ``tr(sqrtm(S_1 S_2))`` (the two products have the same eigenvalues) and, unlike
``scipy.linalg.sqrtm`` of the non-symmetric ``S_1 S_2``, never returns complex parts: eigenvalues
that round to slightly below zero are clipped to 0.
"""

from __future__ import annotations

import numpy as np


def gaussian_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of ``features`` (n, d), in float64.

    Raises:
        ValueError: ``features`` is not 2-D or has fewer than 2 rows.
    """
    f = np.asarray(features, np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"features must be (n >= 2, d), got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False).reshape(f.shape[1], f.shape[1])


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric PSD matrix (negative round-off clipped to 0)."""
    w, v = np.linalg.eigh((matrix + matrix.T) / 2)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray,
                     sigma2: np.ndarray) -> float:
    """Squared Frechet (2-Wasserstein) distance between N(mu1, sigma1) and N(mu2, sigma2).

    Raises:
        ValueError: the shapes do not match (means (d,), covariances (d, d)).
    """
    mu1, mu2 = (np.atleast_1d(np.asarray(m, np.float64)) for m in (mu1, mu2))
    s1, s2 = (np.atleast_2d(np.asarray(s, np.float64)) for s in (sigma1, sigma2))
    d = mu1.shape[0]
    if mu1.shape != (d,) or mu2.shape != (d,) or s1.shape != (d, d) or s2.shape != (d, d):
        raise ValueError(f"expected means (d,) and covariances (d, d) with one d; got "
                         f"{mu1.shape}, {s1.shape}, {mu2.shape}, {s2.shape}")
    root1 = _psd_sqrt(s1)
    product = root1 @ s2 @ root1
    cross = np.linalg.eigvalsh((product + product.T) / 2)
    trace_sqrt = float(np.sum(np.sqrt(np.clip(cross, 0.0, None))))
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * trace_sqrt)


def frechet_distance_of(features1: np.ndarray, features2: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to two feature sets (n1, d) and (n2, d)."""
    return frechet_distance(*gaussian_statistics(features1), *gaussian_statistics(features2))
