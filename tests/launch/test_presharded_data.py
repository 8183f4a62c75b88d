"""Input that is already this rank's shard (``hpcrep.tensorflow.hdf5_dataset``, marked with
tf.data's ``auto_shard_policy = OFF``) under ``mpirun -n 2 python -m hpcrep``: transparent mode
leaves it alone, so a Python loop and ``model.fit`` see every row of a real HDF5 file exactly once
across the ranks in every epoch, and ``fit`` runs the reader's steps per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

# The module-scoped job fixtures run once: make test-launch (pytest-xdist, --dist loadgroup)
# keeps this module's tests on one worker.
pytestmark = pytest.mark.xdist_group("presharded_data")

N = 2  # any rank count works: the expectations below follow from N
ROWS, BATCH, EPOCHS = 64, 4, 2
STEPS = ROWS // (BATCH * N)  # per rank and epoch (hpcrep.data.reader.shard_for)
JOB = str(Path(__file__).with_name("presharded_job.py"))


@pytest.fixture(scope="module")
def records(mpirun):
    with mpirun.scratch("presharded") as out:
        rng = np.random.default_rng(0)
        h5 = out / "rows.h5"
        with h5py.File(h5, "w") as f:
            f["x"] = rng.normal(size=(ROWS, 3)).astype(np.float32)
            f["y"] = rng.normal(size=(ROWS, 1)).astype(np.float32)
            f["id"] = np.arange(ROWS, dtype=np.int64) * 10 + 7  # unique, not row numbers
        proc = mpirun.run(N, [mpirun.python, "-m", "hpcrep", JOB, str(h5), str(out),
                              "--batch", str(BATCH), "--epochs", str(EPOCHS)], timeout=240)
        assert proc.returncode == 0, f"job failed:\n{proc.stdout}\n{proc.stderr}"
        yield [json.loads((out / f"rank{r}.json").read_text()) for r in range(N)]


def _check_every_row_once(records, what):
    expected = sorted(np.arange(STEPS * BATCH * N) * 10 + 7)  # rows past STEPS*BATCH*N: dropped
    for epoch in range(EPOCHS):
        per_rank = [r[what][epoch] for r in records]
        assert [len(ids) for ids in per_rank] == [STEPS * BATCH] * N, (what, epoch)
        union = sorted(i for ids in per_rank for i in ids)
        assert union == expected, f"{what}, epoch {epoch}: rows seen across ranks {union}"


def test_a_python_loop_sees_every_row_once_across_ranks(records):
    _check_every_row_once(records, "loop")


def test_fit_sees_every_row_once_across_ranks_in_the_readers_steps(records):
    _check_every_row_once(records, "fit")
    assert [r["fit_steps"] for r in records] == [[STEPS] * EPOCHS] * N
