"""Failures under ``python -m hpcrep``: one rank's exception takes the whole job down fast, naming
the rank; ``sys.exit(0)`` ends cleanly; ``sys.exit(n)`` on one rank aborts with a non-zero code."""

from __future__ import annotations

import os
import textwrap
import time

N = 4
# The other ranks go on training for far longer than the job's 180 s timeout, so a job that
# waited for the failed rank would not end at all; the abort takes about a second (measured
# under 10 s). 60 s tells the two apart with room for a loaded 2-core machine.
ENDS_WITHIN = 60

# Every rank builds a model; rank BAD does something, the others train for minutes (so a rank
# left waiting in a collective would hang the job far beyond the deadline).
SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np, keras
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((4096, 4), np.float32)
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
    if rank == {bad}:
        with open(os.path.join({out!r}, "when"), "w") as f:
            f.write(repr(time.time()))
        {action}
    model.fit(x, x[:, :1], batch_size=1, epochs=1000, verbose=0)
    """)


def run_script(mpirun, scratch, action: str, bad: int = 2):
    script = scratch / "script.py"
    script.write_text(SCRIPT.format(bad=bad, out=str(scratch), action=action))
    proc = mpirun.run(N, [mpirun.python, "-m", "hpcrep", str(script)], timeout=180)
    return proc, time.time()


def test_an_exception_on_one_rank_brings_the_job_down_naming_the_rank(mpirun, scratch):
    proc, ended = run_script(mpirun, scratch,
                             "raise RuntimeError('injected failure on this rank')")
    assert proc.returncode != 0
    assert "hpcrep: rank 2 of 4" in proc.stderr and "unhandled exception" in proc.stderr
    assert "RuntimeError: injected failure on this rank" in proc.stderr
    raised = float((scratch / "when").read_text())
    assert ended - raised < ENDS_WITHIN, f"job took {ended - raised:.1f} s to end after the raise"


def test_sys_exit_with_an_error_code_on_one_rank_aborts_the_job(mpirun, scratch):
    proc, ended = run_script(mpirun, scratch, "sys.exit(3)", bad=1)
    assert proc.returncode != 0
    assert "hpcrep: rank 1 of 4" in proc.stderr and "sys.exit(3)" in proc.stderr
    assert ended - float((scratch / "when").read_text()) < ENDS_WITHIN


def test_sys_exit_0_and_a_normal_end_exit_cleanly_on_every_rank(mpirun, scratch):
    script = scratch / "ok.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        import keras
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        open(os.path.join({str(scratch)!r}, f"done{{rank}}"), "w").close()
        if len(sys.argv) > 1:
            sys.exit(0)
        """))
    for args in ([], ["exit"]):
        for r in range(N):
            (scratch / f"done{r}").unlink(missing_ok=True)
        proc = mpirun.run(N, [mpirun.python, "-m", "hpcrep", str(script), *args], timeout=180)
        assert proc.returncode == 0, proc.stderr
        assert "aborting" not in proc.stderr
        assert sorted(os.listdir(scratch)) == sorted(["ok.py"] + [f"done{r}" for r in range(N)])
