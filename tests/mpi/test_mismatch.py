"""Mismatched collectives raise a precise error on every rank, quickly, and never hang."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.errors import CollectiveMismatchError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def multi(world):
    if world[1] < 2:
        pytest.skip("a mismatch needs at least 2 ranks (this run has 1)")
    return world


def _raises(fn, *fragments):
    start = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as info:
        fn()
    elapsed = time.monotonic() - start
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    # One 16-byte allreduce finds a mismatch before any data moves, so this takes milliseconds;
    # what matters is that it does not hang (the 60 s timeout). 30 s only flags a check that
    # waits for something, with room for a loaded 2-core machine running 4 ranks.
    assert elapsed < 30, f"error took {elapsed:.1f} s"
    return str(info.value)


def test_shape_mismatch_names_tensor_and_ranks(multi):
    r, n = multi
    x = np.ones(3 if r == 0 else 4, np.float32)
    msg = _raises(lambda: hc.allreduce(x, name="grad_w"), "'grad_w'", "rank 0 passed float32[3]",
                  "passed float32[4]")
    assert "ranks 1" in msg or n == 2


def test_dtype_mismatch(multi):
    r, _ = multi
    x = np.ones(3, np.float32 if r == 0 else np.float64)
    _raises(lambda: hc.allreduce(x, name="bias"), "'bias'", "float32[3]", "float64[3]")


def test_count_mismatch_in_group(multi):
    r, _ = multi
    arrays = [np.ones(2)] * (2 if r == 0 else 3)
    _raises(lambda: hc.grouped_allreduce(arrays, name="g"), "different numbers of tensors",
            "2 tensor(s)", "3 tensor(s)")


def test_op_and_root_mismatch(multi):
    r, _ = multi
    _raises(lambda: hc.allreduce(np.ones(2), hc.Sum if r == 0 else hc.Max), "parameters")
    _raises(lambda: hc.broadcast(np.ones(2), root_rank=0 if r == 0 else 1), "parameters")


def test_allgather_trailing_shape_mismatch(multi):
    r, _ = multi
    x = np.ones((r + 1, 2 if r == 0 else 3))
    _raises(lambda: hc.allgather(x, name="feat"), "'feat'", "float64[*, 2]", "float64[*, 3]")


def test_mismatch_after_agreed_calls_and_recovery(multi):
    """A signature seen before on some ranks still cannot hang, and the comm stays usable."""
    r, n = multi
    for _ in range(3):
        hc.allreduce(np.ones(5), hc.Sum)
    x = np.ones(5 if r == 0 else 6)
    _raises(lambda: hc.allreduce(x, hc.Sum, name="w"), "'w'")
    np.testing.assert_array_equal(hc.allreduce(np.ones(5), hc.Sum), np.full(5, n))


def test_different_collectives(multi):
    r, _ = multi
    x = np.ones(4)

    def call():
        return hc.allreduce(x) if r == 0 else hc.broadcast(x, 0)

    _raises(call, "different collectives", "allreduce", "broadcast")


def test_a_skipped_collective_leaves_every_rank_a_flight_record_naming_where(multi, shared_dir,
                                                                            monkeypatch, capfd):
    """One rank skips a collective: the mismatch check fails at its next call, every rank writes
    its last collectives to a file, and the lowest rank's summary names the call at which the
    histories first differ and what each rank did there (hpcrep/comm/flight.py)."""
    r, n = multi
    monkeypatch.setenv("HPCREP_FLIGHT_DIR", shared_dir)
    monkeypatch.setenv("SLURM_JOB_ID", "skip")  # one file name on every rank
    hc.barrier()
    hc.allreduce(np.ones(4, np.float32), name="before")

    def rank_1_skips_one():
        if r != 1:
            hc.allreduce(np.ones(4, np.float32), name="skipped_by_rank_1")
        hc.broadcast(np.ones(2, np.float32), name="after")

    _raises(rank_1_skips_one, "ranks called different collectives")
    hc.barrier()
    for k in range(n):
        record = json.loads(Path(f"{shared_dir}/hpcrep-flight-skip-rank{k}.json").read_text())
        assert record["rank"] == k and record["reason"] == "collective mismatch"
        last = record["entries"][-1]
        assert (last["kind"], last["end"]) == (("broadcast", None) if k == 1
                                               else ("allreduce", None)), last
        assert last["frame"].startswith(__file__), last["frame"]
    err = capfd.readouterr().err
    if r == 0:
        line = [x for x in err.splitlines() if "flight recorder (collective mismatch)" in x]
        assert line, err
        assert ("rank 1: broadcast of 'after'" in line[0]
                and "allreduce of 'skipped_by_rank_1'" in line[0]), line[0]
        assert "hpcrep-flight-skip-rank<r>.json" in line[0]
