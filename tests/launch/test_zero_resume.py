"""Sharded optimizer state saved at 4 ranks restores at 2, sharded or not, and continues along
the trajectory of the uninterrupted 4-rank run (``zero_resume_job.py``).

Compared: the restored state (Adam's step counter, rate and both moments, in the unsharded
layout) equals bitwise what the 4-rank job saved, with and without sharding at 2 ranks; the
final weights and state of the resumed runs equal the uninterrupted run's within float32
rounding (the global batch is the same; only the order of the gradient sum changes); every rank
of each job ends bitwise equal.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

JOB = str(Path(__file__).with_name("zero_resume_job.py"))


def digests(stderr: str) -> list[str]:
    return re.findall(r"zero-digest ([0-9a-f]{64}) rank \d+", stderr)


def arrays(path, prefix: str) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files) if k.startswith(prefix)]


@pytest.mark.timeout(600)
def test_save_at_4_resume_at_2_with_and_without_sharding(mpirun, scratch):
    ckpt, out = scratch / "ckpt", scratch
    saved = mpirun.run(4, [sys.executable, JOB, "--phase", "save", "--dir", str(ckpt),
                           "--out", str(out)], timeout=300)
    assert saved.returncode == 0, saved.stdout[-3000:] + saved.stderr[-3000:]
    assert len(digests(saved.stderr)) == 4 and len(set(digests(saved.stderr))) == 1, \
        saved.stderr[-2000:]
    for plain in (False, True):
        resumed = mpirun.run(2, [sys.executable, JOB, "--phase", "resume", "--dir", str(ckpt),
                                 "--out", str(out)] + (["--plain"] if plain else []), timeout=300)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        ends = digests(resumed.stderr)
        assert len(ends) == 2 and len(set(ends)) == 1, resumed.stderr[-2000:]

        name = "resume-plain.npz" if plain else "resume.npz"
        restored = arrays(out / name, "restored_")
        written = arrays(out / "save.npz", "saved_")
        assert len(restored) == len(written) == 2 + 2 * 4  # iterations, rate, m and v of 4
        for a, b in zip(restored, written):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(arrays(out / name, "final_"), arrays(out / "save.npz", "final_")):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
