"""Keras's own fault tolerance under hpcrep: kill -9 one rank of a 2-rank ``fit``, rerun the same
command, and the run resumes from the last backup and ends bitwise equal to an uninterrupted run
(model weights and every optimizer variable, compared dataset by dataset in the final weights
file). Covered: ``keras.callbacks.BackupAndRestore`` and ``ModelCheckpoint`` +
``model.load_weights`` under transparent mode, ``hvd.callbacks.BackupAndRestore`` with the
explicit API, and ``HPCREP_CHECKPOINT_DIR`` with ``fit``. The job is ``keras_resume_job.py``
(op determinism, fixed seeds, no shuffling)."""

from __future__ import annotations

import numpy as np
import pytest

RANKS, EPOCHS, KILL_AFTER = 2, 8, 3


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    assert any(k.startswith("optimizer/") for k in a), sorted(a)  # optimizer state compared too
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("api, protect, victim", [
    ("transparent", "backup", 1),
    ("transparent", "modelcheckpoint", 0),  # rank 0 is the one that writes
    ("explicit", "backup", 1),
])  # HPCREP_CHECKPOINT_DIR: rerun-and-resume in test_resume_other_rank_count.py; kill -9 and a
# bitwise resume from hpcrep checkpoints in test_kill_resume.py (and across nodes, tests/cluster)
def test_kill9_then_rerun_resumes_bitwise(api, protect, victim, mpirun, scratch, keras_job,
                                          epochs_logged, weights_file):
    root = scratch
    ref = mpirun.run(RANKS, keras_job.argv(api, protect, root / "ref-dir", root / "ref", EPOCHS),
                     timeout=300)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    assert epochs_logged(root / "ref") == list(range(EPOCHS))

    argv = keras_job.argv(api, protect, root / "dir", root / "out", EPOCHS,
                          "--progress", str(root / "progress"))
    mpirun.run_and_kill(RANKS, argv + ["--sleep", "0.7"], str(root / "progress"), victim,
                        KILL_AFTER)
    assert not (root / "out" / "final.weights.h5").exists()

    again = mpirun.run(RANKS, argv, timeout=300)  # the same job, without the killer's pacing
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed_from = epochs_logged(root / "out")[0]
    assert KILL_AFTER <= resumed_from < EPOCHS  # not from scratch, not past the end
    assert epochs_logged(root / "out") == list(range(resumed_from, EPOCHS))
    assert len(keras_job.digests(again.stderr)) == 1, again.stderr[-2000:]  # ranks agree
    resumed = weights_file(root / "out" / "final.weights.h5")
    assert_bitwise_equal(resumed, weights_file(root / "ref" / "final.weights.h5"))
    print(f"{api}/{protect}: rank {victim} killed after {KILL_AFTER}+ epochs; the rerun "
          f"resumed at epoch {resumed_from} of {EPOCHS}; {len(resumed)} arrays bitwise equal")
