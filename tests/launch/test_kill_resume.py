"""kill -9 one rank of a 2-rank training run (4-rank with PowerSGD; 4 ranks across two nodes:
tests/cluster/test_failures.py): the job exits (no hang), the same command resumes from the last
checkpoint, and the final weights equal an uninterrupted run's bitwise (op determinism on, fixed
seeds, data a pure function of step and rank plus label noise drawn from the global generators
after the resume (so their restored state counts), MPI reductions in a fixed order at a fixed
world size). The same under ``mixed_float16`` (``--mixed-precision``): the loss scale grows, one
rank's overflow makes every rank skip a step (before and after the kill), and the final loss
scale, its step counter and every other optimizer variable equal the uninterrupted run's too.
And with PowerSGD (``--powersgd 2``): the checkpoint holds each rank's own error buffers (they
differ between ranks) and the resumed run gives every rank its own back."""

import os

import numpy as np
import pytest

from hpcrep.checkpoint import CheckpointManager, read_verified

RANKS, KILL_AT = 2, 12
INITIAL_SCALE = 256.0


def train(mpirun, scratch, name: str, steps: int, sleep: float, *extra: str
          ) -> tuple[list[str], str]:
    """The argv of slurm/examples/train_resumable.py writing into SCRATCH/NAME, and that dir."""
    d = os.path.join(scratch, name)
    return [mpirun.python, str(mpirun.root / "slurm" / "examples" / "train_resumable.py"),
            "--dir", d, "--steps", str(steps), "--save-every", "5", "--sleep", str(sleep),
            "--progress", os.path.join(scratch, f"{name}-progress"),
            "--out", os.path.join(d, "final.npz"),
            "--out-optimizer", os.path.join(d, "final-optimizer.npz"), *extra], d


def final_state(directory) -> dict:
    """Every model variable (``arr_<i>``) and optimizer variable (``<i>_<name>``) the run ended
    with."""
    state = {}
    for name in ("final.npz", "final-optimizer.npz"):
        with np.load(os.path.join(directory, name)) as z:
            state.update({k: z[k] for k in z.files})
    return state


def resumed_loss_scale(run_dir, step: int, names) -> dict:
    """``dynamic_scale`` and ``step_counter`` in the checkpoint of ``step``; ``names`` (the keys
    ``<i>_<name>`` of the final optimizer state) give their positions in its optimizer list."""
    arrays, _ = read_verified(CheckpointManager(run_dir).path_for(step))
    return {key[3:]: float(arrays[f"optimizer/{int(key[:2]):05d}"]) for key in names
            if key[3:] in ("dynamic_scale", "step_counter")}


def summary(stdout: str) -> dict:
    """The ``done: steps=.. loss=.. applied=.. [loss_scale=..]`` line of rank 0, as a dict."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith("done: "))
    return dict(item.split("=") for item in line[len("done: "):].split())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("ranks, steps, extra", [
    (RANKS, 30, ()),
    # Shorter: 20 steps still overflow on one rank before the kill (step 7) and after (step 17).
    # From 256, doubling every 3 finite steps, the scale stays clear of float16's own overflows.
    (RANKS, 20, ("--mixed-precision", "--initial-scale", str(INITIAL_SCALE),
                 "--growth-steps", "3")),
    # Warm-up over by the kill (step 12) and by the checkpoint it resumes from (step 10); at 4
    # ranks, so that three other ranks' error buffers must come back to their own ranks.
    (4, 30, ("--powersgd", "2", "--warmup", "3")),
], ids=["float32", "mixed_float16", "powersgd"])
def test_kill9_one_rank_then_resume_matches_uninterrupted(ranks, steps, extra, mpirun, scratch):
    ref_argv, ref_dir = train(mpirun, scratch, "reference", steps, 0.0, *extra)  # no one to wait
    done = mpirun.run(ranks, ref_argv, cwd=mpirun.root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    argv, run_dir = train(mpirun, scratch, "killed", steps, 0.3, *extra)
    mpirun.run_and_kill(ranks, argv, os.path.join(scratch, "killed-progress"), victim=1,
                        after=KILL_AT)
    assert not os.path.exists(os.path.join(run_dir, "final.npz"))
    saved = sorted(int(n[5:14]) for n in os.listdir(run_dir) if n.startswith("ckpt-"))
    assert saved and saved[-1] < steps, saved

    if "--powersgd" in extra:  # it resumes from each rank's own error buffers, which differ
        arrays, _ = read_verified(CheckpointManager(run_dir).path_for(saved[-1]))
        errors = [arrays[f"rank_local/{r:05d}/00000"] for r in range(ranks)]
        assert errors[0].shape == (8, 32) and np.abs(errors[0]).max() > 0
        assert not any(np.array_equal(errors[0], e) for e in errors[1:])

    # The same job again, without the pacing that let the killer catch it mid-run.
    again = mpirun.run(ranks, train(mpirun, scratch, "killed", steps, 0.0, *extra)[0],
                       cwd=mpirun.root)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"start_step={saved[-1]} resumed_from=ckpt-{saved[-1]:09d}.h5" in again.stdout
    resumed, reference = final_state(run_dir), final_state(ref_dir)
    assert sorted(resumed) == sorted(reference)
    assert sum(k.startswith("arr_") for k in reference) == 4
    assert any(k.endswith("_momentum") for k in reference), sorted(reference)
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name], err_msg=name)
    assert summary(again.stdout) == summary(done.stdout)
    if "--powersgd" in extra:
        assert any(k.endswith("_powersgd_q") for k in reference), sorted(reference)
    elif extra:  # the run resumed from a loss scale that had moved, and skipped steps
        at_resume = resumed_loss_scale(run_dir, saved[-1], reference)
        assert at_resume["dynamic_scale"] != INITIAL_SCALE, at_resume
        assert at_resume["step_counter"] != 0, at_resume
        assert int(summary(done.stdout)["applied"]) <= steps - 2
        print(f"resumed at step {saved[-1]} with {at_resume}; end: {summary(again.stdout)}")
