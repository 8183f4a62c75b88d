"""A plain script's own directories and files under ``mpirun -n 4 python -m hpcrep``
(``own_files_job.py``): its check-then-create of directories never fails on the rank that loses
the race, and every file it writes from every rank at once ends on disk whole and rank 0's, while
each rank reads back what it wrote itself; the ranks' private copies are gone afterwards."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

N = 4
JOB = str(Path(__file__).with_name("own_files_job.py"))


@pytest.fixture(scope="module")
def job(mpirun):
    with mpirun.scratch("own-files") as root:
        work, tmp = root / "work", root / "tmp"
        work.mkdir()
        tmp.mkdir()
        proc = mpirun.run(N, [mpirun.python, "-m", "hpcrep", JOB], timeout=280, cwd=work,
                          env={"TMPDIR": str(tmp)})
        yield proc, work, tmp


@pytest.mark.timeout(300)
def test_the_script_runs_unchanged_on_every_rank(job):
    proc, work, _ = job
    assert proc.returncode == 0, f"job failed:\n{proc.stdout}\n{proc.stderr}"
    assert "aborting" not in proc.stderr
    dirs = sorted(p.name for p in (work / "ckpt").iterdir())
    assert len(dirs) == 400 and all((work / "ckpt" / d).is_dir() for d in dirs)


@pytest.mark.timeout(300)
def test_every_file_on_disk_is_rank_zeros_and_whole(job):
    proc, work, _ = job
    assert proc.returncode == 0, proc.stderr
    pids = re.findall(r"own_files_job: pid (\d+)", proc.stdout)
    assert len(pids) == 1, proc.stdout  # rank 0 alone prints
    pid0 = int(pids[0])
    rng = np.random.default_rng(pid0)
    pixels = rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
    with Image.open(work / "generated_img_0.png") as img:
        assert img.size == (128, 96)
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), pixels)
    with Image.open(work / "figure.png") as fig:
        fig.load()  # a torn PNG fails here
    np.testing.assert_array_equal(np.load(work / "array.npy"), rng.normal(size=200_000))
    np.testing.assert_allclose(np.loadtxt(work / "values.txt"), rng.normal(size=(50, 3)),
                               rtol=1e-15)
    text = f"written by process {pid0}\n" * 1000
    assert (work / "notes.txt").read_text() == text
    assert (work / "notes2.txt").read_text() == text
    assert f"written by process {pid0}" in proc.stdout  # rank 0 read its own file back
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["ckpt", "generated_img_0.png", "figure.png", "array.npy", "values.txt", "notes.txt",
         "notes2.txt"])


@pytest.mark.timeout(300)
def test_no_private_copies_are_left_behind(job):
    proc, _, tmp = job
    assert proc.returncode == 0, proc.stderr
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("hpcrep-")]
