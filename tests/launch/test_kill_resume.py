"""kill -9 one rank of a 4-rank training run: the job exits (no hang), the same command resumes
from the last checkpoint, and the final weights equal an uninterrupted run's bitwise (op
determinism on, fixed seeds, data a pure function of step and rank plus label noise drawn from
the global generators after the resume (so their restored state counts), MPI reductions in a fixed
order at a fixed world size)."""

import os

import numpy as np
import pytest

RANKS, STEPS, KILL_AT = 4, 30, 12


def train(mpirun, scratch, name: str) -> tuple[list[str], str]:
    """The argv of slurm/examples/train_resumable.py writing into SCRATCH/NAME, and that dir."""
    d = os.path.join(scratch, name)
    return [mpirun.python, str(mpirun.root / "slurm" / "examples" / "train_resumable.py"),
            "--dir", d, "--steps", str(STEPS), "--save-every", "5", "--sleep", "0.3",
            "--progress", os.path.join(scratch, f"{name}-progress"),
            "--out", os.path.join(d, "final.npz")], d


def final_weights(directory):
    with np.load(os.path.join(directory, "final.npz")) as z:
        return [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.timeout(900)
def test_kill9_one_rank_then_resume_matches_uninterrupted(mpirun, scratch):
    ref_argv, ref_dir = train(mpirun, scratch, "reference")
    done = mpirun.run(RANKS, ref_argv, cwd=mpirun.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    argv, run_dir = train(mpirun, scratch, "killed")
    mpirun.run_and_kill(RANKS, argv, os.path.join(scratch, "killed-progress"), victim=2,
                        after=KILL_AT)
    assert not os.path.exists(os.path.join(run_dir, "final.npz"))
    saved = sorted(int(n[5:14]) for n in os.listdir(run_dir) if n.startswith("ckpt-"))
    assert saved and saved[-1] < STEPS, saved

    again = mpirun.run(RANKS, argv, cwd=mpirun.root)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"start_step={saved[-1]} resumed_from=ckpt-{saved[-1]:09d}.h5" in again.stdout
    resumed, reference = final_weights(run_dir), final_weights(ref_dir)
    assert len(resumed) == len(reference) == 4
    for a, b in zip(resumed, reference):
        np.testing.assert_array_equal(a, b)
