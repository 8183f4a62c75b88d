"""Random-number-generator state as plain arrays (no pickle): Python's ``random`` and numpy's
global generator. TensorFlow's generator state is captured in :mod:`hpcrep.tensorflow`."""

from __future__ import annotations

import random
from typing import Mapping

import numpy as np


def host_rng_state() -> dict[str, np.ndarray]:
    """Return the state of ``random`` and ``np.random`` (the legacy global MT19937) as arrays."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    assert kind == "MT19937"
    return {
        "python_version": np.array(version, np.int64),
        "python_internal": np.array(internal, np.uint64),
        "python_gauss": np.array([gauss is not None, gauss or 0.0], np.float64),
        "numpy_keys": np.asarray(keys, np.uint32),
        "numpy_pos_gauss": np.array([pos, has_gauss], np.int64),
        "numpy_cached_gaussian": np.array(cached, np.float64),
    }


def set_host_rng_state(state: Mapping[str, np.ndarray]) -> None:
    """Restore what :func:`host_rng_state` returned."""
    gauss = state["python_gauss"]
    random.setstate((int(state["python_version"]),
                     tuple(int(x) for x in state["python_internal"]),
                     float(gauss[1]) if gauss[0] else None))
    pos, has_gauss = (int(x) for x in state["numpy_pos_gauss"])
    np.random.set_state(("MT19937", np.asarray(state["numpy_keys"], np.uint32), pos, has_gauss,
                         float(state["numpy_cached_gaussian"])))
