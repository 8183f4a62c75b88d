"""The unchanged jobs/ scripts under ``mpirun -n 4 python -m hpcrep``: equal weights, disjoint
quarters of the data, falling loss, files and printing on rank 0 only."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pytest

# The module-scoped job fixtures run once: make test-launch (pytest-xdist, --dist loadgroup)
# keeps this module's tests on one worker.
pytestmark = pytest.mark.xdist_group("transparent_jobs")

N = 4
PROBE = str(Path(__file__).with_name("probe.py"))
JOBS = {
    "transparent_fit_tfdata.py": ["--rows", "4096", "--epochs", "3"],
    "transparent_fit_numpy.py": ["--rows", "4096", "--epochs", "3", "--out", "outputs"],
    "transparent_custom_loop.py": ["--rows", "4096", "--epochs", "3"],
}


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request, mpirun, finished_jobs):
    stack, done = finished_jobs
    script = request.param
    if ("transparent", script) not in done:
        out = stack.enter_context(mpirun.scratch(script.replace(".py", "")))
        proc = mpirun.run(N, [mpirun.python, PROBE, str(out), str(mpirun.root / "jobs" / script),
                              *JOBS[script]], timeout=280)
        assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
        done["transparent", script] = out, proc
    return (script, *done["transparent", script])


def test_every_rank_ends_with_the_same_weights(job):
    _, out, _ = job
    weights = [np.load(out / f"rank{r}.npz") for r in range(N)]
    assert len(weights[0].files) >= 4
    for other in weights[1:]:
        assert sorted(other.files) == sorted(weights[0].files)
        for key in weights[0].files:
            np.testing.assert_array_equal(other[key], weights[0][key], err_msg=key)


def test_each_rank_trained_on_a_disjoint_quarter(job):
    _, out, _ = job
    records = [[r for r in json.loads((out / f"rank{k}.json").read_text()) if r["equal"]]
               for k in range(N)]
    assert all(records), "no training input was sharded"
    first = [r[0] for r in records]
    full = collections.Counter(first[0]["full"])
    assert all(collections.Counter(f["full"]) == full for f in first), "ranks saw different data"
    union = collections.Counter()
    for f in first:
        union.update(f["mine"])
    assert union == full, "a row went to more than one rank, or to none"  # every row once
    total = sum(full.values())
    for k, f in enumerate(first):  # a quarter each: n // N rows or one more
        assert total // N <= len(f["mine"]) <= -(-total // N), (k, len(f["mine"]), total)


def test_the_loss_falls_and_only_rank_0_printed(job):
    script, _, proc = job
    lines = re.findall(r"train loss ([\d.]+) -> ([\d.]+)", proc.stdout)
    assert len(lines) == 1, f"expected one summary line (rank 0 only), got {lines}"
    first, last = map(float, lines[0])
    assert last < 0.8 * first, (script, first, last)
    assert proc.stderr.count("hpcrep transparent mode: 4 rank(s)") == 1


def test_only_rank_0_wrote_files(job):
    script, out, _ = job
    written = {k: sorted(p.relative_to(out / f"cwd{k}").as_posix()
                         for p in (out / f"cwd{k}").rglob("*") if p.is_file()) for k in range(N)}
    for k in range(1, N):
        assert written[k] == [], f"rank {k} wrote {written[k]}"
    if script == "transparent_fit_numpy.py":
        assert written[0] == ["outputs/best.keras", "outputs/final.weights.h5", "outputs/log.csv"]
        log = (out / "cwd0" / "outputs" / "log.csv").read_text().splitlines()
        assert log[0].startswith("epoch") and len(log) == 4
