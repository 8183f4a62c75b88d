"""Mixed precision with one rank overflowing, launched as a user would: the job ends normally
(before hpcrep reduced ahead of the loss-scale check it hung until the stall watchdog aborted it)
and every rank ends with the same weights, loss scale and step count, with steps skipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

JOB = str(Path(__file__).with_name("mixed_precision_job.py"))
LINE = re.compile(r"rank (\d+): weights-digest ([0-9a-f]{64}) scale (\S+) iterations (\d+)")
STEPS = 2 * 256 // 16  # 2 epochs of 256 rows in batches of 16, shared by the ranks


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api,ranks", [("transparent", 2), ("transparent", 4),
                                       ("compile", 4), ("outer", 4)])
def test_one_rank_overflowing_never_splits_the_ranks(mpirun, api, ranks):
    runner = [mpirun.python, "-m", "hpcrep"] if api == "transparent" else [mpirun.python]
    # A hang would end at the watchdog's 60 s (exit 75), well before the test's timeout.
    proc = mpirun.run(ranks, [*runner, JOB, "--api", api], timeout=240,
                      env={"HPCREP_STALL_TIMEOUT": "60"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {int(m[0]): m[1:] for m in LINE.findall(proc.stderr)}
    assert sorted(found) == list(range(ranks)), proc.stderr[-3000:]
    assert len(set(found.values())) == 1, found  # same weights, scale and steps everywhere
    _, scale, iterations = found[0]
    steps = STEPS // ranks
    assert 0 < int(iterations) < steps, (iterations, steps)  # overflow steps were skipped
    assert float(scale) < 2.0 ** 15  # and the loss scale went down, on every rank alike
