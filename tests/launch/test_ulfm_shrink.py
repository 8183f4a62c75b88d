"""ULFM on Open MPI 5 (``.venv-ulfm``, made by ``make ulfm``): one of 4 ranks is SIGKILLed in a
numpy allreduce loop, and the 3 others shrink their communicator (hpcrep.comm.ulfm), resume from
the step they agree on, finish with correct sums, and mpirun exits 0. And ``ulfm.finalize`` ends
a rank whose ``MPI_Finalize`` cannot complete.

Skipped (a failure under CI=true) when ``.venv-ulfm`` has not been made.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANKS, STEPS, VICTIM, KILL_AT = 4, 200, 2, 50


@pytest.mark.timeout(240)
def test_survivors_of_a_sigkilled_rank_shrink_and_finish(ulfm_venv, scratch):
    job = [str(ulfm_venv / "bin" / "python"), str(HERE / "ulfm_shrink_job.py"), str(scratch),
           str(STEPS), str(VICTIM), str(KILL_AT)]
    argv = mpirun_command(RANKS, job, mpirun=str(ulfm_venv / "bin" / "mpirun"),
                          extra=["--with-ft", "ulfm"])
    env = mpirun_env({**os.environ, "PYTHONUNBUFFERED": "1",
                      "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the ULFM job did not end within 180 s:\n{exc.stdout}\n{exc.stderr}")
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    death = float((scratch / "death").read_text())
    survivors = [r for r in range(RANKS) if r != VICTIM]
    assert sorted(p.name for p in scratch.glob("rank*.json")) == \
        [f"rank{r}.json" for r in survivors], output
    delays, shrink_ms, resumed, classes = [], [], set(), []
    for r in survivors:
        res = json.loads((scratch / f"rank{r}.json").read_text())
        assert "Open MPI v5" in res["library"], res["library"]
        assert res["has_ulfm"], res
        assert res["size"] == RANKS - 1 and res["steps"] == STEPS, res
        assert res["wrong"] == [], f"rank {r}: wrong sums {res['wrong'][:5]}"
        assert [s["lost"] for s in res["shrinks"]] == [[VICTIM]], res["shrinks"]
        # The victim took part in step KILL_AT - 1, so every survivor completed KILL_AT - 2.
        # Step KILL_AT - 1 itself may have failed on a survivor that was still in it when a
        # faster one revoked the communicator (ERR_REVOKED): then they all redo it.
        assert res["shrinks"][0]["step"] in (KILL_AT - 1, KILL_AT), res["shrinks"]
        resumed.add(res["shrinks"][0]["step"])
        classes.append(res["shrinks"][0]["error_class"])
        delays.append(1e3 * (res["first_good"] - death))
        shrink_ms.append(1e3 * res["shrinks"][0]["seconds"])
    assert len(resumed) == 1, f"the survivors resumed from different steps: {resumed}"
    print(f"\nULFM: rank {VICTIM} of {RANKS} SIGKILLed at step {KILL_AT}, resumed at "
          f"{resumed.pop()}; death to first good "
          f"allreduce: {', '.join(f'{d:.1f}' for d in delays)} ms; revoke+shrink+agree: "
          f"{', '.join(f'{d:.1f}' for d in shrink_ms)} ms (ranks {survivors}; error classes "
          f"{classes})")
    assert max(delays) < 30e3, delays  # seconds, not minutes: no watchdog, no relaunch


@pytest.mark.timeout(120)
def test_finalize_ends_a_rank_whose_mpi_finalize_cannot_complete(ulfm_venv, scratch):
    """After a failure Open MPI 5's MPI_Finalize can wait for good (seen once in the gate: three
    survivors stuck in it); a rank that never finalizes makes it wait the same way."""
    wait = 6.0
    job = [str(ulfm_venv / "bin" / "python"), str(HERE / "ulfm_finalize_job.py"), str(scratch),
           str(wait)]
    argv = mpirun_command(2, job, mpirun=str(ulfm_venv / "bin" / "mpirun"),
                          extra=["--with-ft", "ulfm"])
    env = mpirun_env({**os.environ, "PYTHONUNBUFFERED": "1",
                      "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    seen = json.loads((scratch / "rank1.json").read_text())
    # rank 0 called finalize(timeout=1) about `wait` s before rank 1 looked: gone, not waiting
    assert seen["checked"] - float((scratch / "finalizing").read_text()) > wait - 1, seen
    assert not seen["rank0_alive_after_wait"], output
