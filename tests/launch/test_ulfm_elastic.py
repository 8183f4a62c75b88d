"""In-process elastic training over ULFM (Open MPI 5, ``.venv-ulfm``): a Keras job under
``@hvd.elastic.run`` loses one of 4 ranks mid-epoch, to SIGKILL or to SIGSTOP (a hung rank, which
ULFM's heartbeat detector declares failed), and the 3 survivors shrink the job, return to the
last commit and finish in the same ``mpirun``, which exits 0 (``ulfm_elastic_job.py``;
hpcrep.comm.recovery; a stopped rank is SIGKILLed by a survivor on its host).

Skipped (a failure under CI=true) when ``.venv-ulfm`` has not been made.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hpcrep.launch.mpirun import mpirun_command, mpirun_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RANKS, VICTIM, KILL_AT, BATCH, ROWS, EPOCHS, SEED = 4, 2, 12, 32, 3072, 2, 0
# ULFM's heartbeat detector: a rank that stops answering (SIGSTOP) is declared failed after 3 s.
# Not in its own thread (Open MPI 5.0.11 segfaulted at start-up in 1 of 10 jobs with it): hpcrep's
# ranks make MPI progress for it from a thread (hpcrep.comm.ulfm.start_progress), or a rank busy
# in TensorFlow would miss its deadlines and be declared dead by the others.
DETECTOR = ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "false",
            "--mca", "mpi_ft_detector_period", "0.5", "--mca", "mpi_ft_detector_timeout", "3"]


def job_env(**extra: str) -> dict:
    """The environment of a job these tests start: ``extra``, this checkout on ``PYTHONPATH``,
    unbuffered output, and what :func:`mpirun_env` adds."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return mpirun_env({**os.environ, "PYTHONUNBUFFERED": "1", **extra, "PYTHONPATH": path})


def elastic_job(venv: Path, out: Path, *extra: str) -> list[str]:
    """The command line of ulfm_elastic_job.py with this module's sizes, then ``extra``."""
    return [str(venv / "bin" / "python"), str(HERE / "ulfm_elastic_job.py"), "--out", str(out),
            "--rows", str(ROWS), "--epochs", str(EPOCHS), "--batch", str(BATCH),
            "--commit-every", "4", "--seed", str(SEED), *extra]


def transparent_job(venv: Path, out: Path) -> list[str]:
    """The command line of transparent_elastic_job.py under ``python -m hpcrep --elastic``."""
    return [str(venv / "bin" / "python"), "-m", "hpcrep", "--elastic",
            str(HERE / "transparent_elastic_job.py"), str(out)]


def assert_same_weights(want, got, what: str = "") -> None:
    """Assert that the arrays of the weight files ``want`` and ``got`` are bitwise equal."""
    for key in want.files:
        np.testing.assert_array_equal(want[key], got[key], err_msg=f"{key}: {what}")


def run_job(venv: Path, out: Path, *extra: str, timeout: float = 240, env: dict = None,
            ranks: int = RANKS, ulfm: bool = True):
    """Run ulfm_elastic_job.py on ``ranks`` local ranks, under ``--with-ft ulfm`` with the
    detector unless ``ulfm`` is False; ``env`` reaches the ranks (``-x``)."""
    passed = [arg for name in (env or {}) for arg in ("-x", name)]
    argv = mpirun_command(ranks, elastic_job(venv, out, *extra),
                          mpirun=str(venv / "bin" / "mpirun"),
                          extra=[*(["--with-ft", "ulfm", *DETECTOR] if ulfm else []), *passed])
    env = job_env(**(env or {}))
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the ULFM elastic job did not end within {timeout} s:\n{exc.stdout}\n"
                    f"{exc.stderr}")


def rows_kept(results: list[dict], victim_fed: list, resume: tuple[int, int]) -> dict:
    """Rows each epoch trained on, in the steps the model kept: every survivor's, and the
    victim's before the commit the survivors resumed from."""
    kept: dict[int, list[int]] = {}
    for fed in [r["fed"] for r in results] + [
            [f for f in victim_fed if (f[0], f[1]) < resume]]:
        for epoch, _start, *rows in fed:
            kept.setdefault(epoch, []).extend(rows)
    return kept


def check_weights_and_rows(scratch: Path, names: list[str], results: list[dict],
                           last_size: int) -> None:
    """Assert that the ranks ``names`` ended with bitwise-equal weights and that every row of
    every epoch was trained on once in what the model kept (the rows of the survivors and of
    the victim before the commit they resumed from); only a tail shorter than a global batch
    of ``last_size`` ranks may be left out."""
    weights = [np.load(scratch / f"weights-{n}.npz") for n in names]
    for other in weights[1:]:
        assert_same_weights(weights[0], other)
    victim_fed = json.loads((scratch / "victim_fed.json").read_text())
    kept = rows_kept(results, victim_fed, (0, KILL_AT * RANKS * BATCH))
    assert sorted(kept) == list(range(EPOCHS)), sorted(kept)
    for epoch, rows in kept.items():
        assert len(rows) == len(set(rows)), f"epoch {epoch}: a row trained on twice"
        order = np.random.default_rng([SEED, epoch]).permutation(ROWS)
        assert set(rows) == set(order[:len(rows)].tolist()), f"epoch {epoch}: a row skipped"
        assert ROWS - len(rows) < last_size * BATCH, (epoch, len(rows))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["kill", "stop", "raise"])
def test_survivors_of_a_lost_rank_shrink_and_finish_the_keras_job(ulfm_venv, scratch, how):
    """A rank SIGKILLed, SIGSTOPped (the detector declares it failed), or ended by an unhandled
    exception (it leaves as a failed rank rather than wait at exit for the others)."""
    done = run_job(ulfm_venv, scratch, "--victim", str(VICTIM), "--kill-at", str(KILL_AT),
                   *({"stop": ["--stop"], "raise": ["--raise"]}.get(how, [])))
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert f"hpcrep: rank(s) {VICTIM} of {RANKS} failed; {RANKS - 1} survivors go on" \
        in done.stderr, output
    survivors = [r for r in range(RANKS) if r != VICTIM]
    assert sorted(p.name for p in scratch.glob("rank*.json")) == \
        [f"rank{r}.json" for r in survivors], output
    results = [json.loads((scratch / f"rank{r}.json").read_text()) for r in survivors]
    death = float((scratch / "death").read_text())
    for old, res in zip(survivors, results):
        assert "Open MPI v5" in res["library"], res["library"]
        # new ranks in the old order; the job's size follows the survivors
        assert (res["rank"], res["size"]) == (survivors.index(old), RANKS - 1), res
        assert [r["lost"] for r in res["recoveries"]] == [[VICTIM]], res["recoveries"]
        # a tf.function traced before the failure averages over the survivors afterwards
        assert res["average_first_rank"] == pytest.approx(np.mean(survivors)), res
        assert res["accuracy"] > 0.6, res["accuracy"]  # it trained (chance: 0.1)
    # every survivor resumed from the same commit, the one at the kill (commits every 4 steps)
    resumes = {tuple(tuple(at[:2]) for at in r["resumes"]) for r in results}
    assert resumes == {((0, 0), (0, KILL_AT * RANKS * BATCH))}, resumes
    # equal weights on every survivor; every row of every epoch trained on once in what the
    # model kept (only the tail that does not fill a global batch of the 3 survivors left out)
    check_weights_and_rows(scratch, [f"rank{r}" for r in survivors], results, RANKS - 1)
    # the first step every survivor completed after it went on (after the victim's death)
    first = max(min(t for t in r["step_ends"] if t > r["resumes"][1][2]) for r in results)
    noticed = [r["recoveries"][0]["noticed"] - death for r in results]
    shrink = [r["recoveries"][0]["shrink_seconds"] for r in results]
    signalled = {"kill": "SIGKILLed", "stop": "SIGSTOPped", "raise": "raised"}[how]
    print(f"\nULFM elastic Keras: rank {VICTIM} of {RANKS} {signalled}; first step of the "
          f"survivors {first - death:.3f} s after; noticed after "
          f"{', '.join(f'{n * 1e3:.0f}' for n in noticed)} ms; revoke + shrink "
          f"{', '.join(f'{s * 1e3:.1f}' for s in shrink)} ms")
    assert first - death < 30, first - death  # seconds, not a watchdog's minute or a relaunch
    if how in ("kill", "raise"):  # the loss cost the steps since the commit and nothing else
        planned = explicit_planned_resize(ulfm_venv, scratch / "planned")
        kept = np.load(scratch / f"weights-rank{survivors[0]}.npz")
        assert_same_weights(kept, planned, "the survivors' weights are not those of the "
                            "planned resize")


def explicit_planned_resize(venv: Path, out: Path) -> np.lib.npyio.NpzFile:
    """Run test_survivors_of_a_lost_rank_shrink_and_finish_the_keras_job's job as a planned
    change from 4 ranks to 3 and return the weights it ends with: the same kill, without ULFM,
    ends the job on 4 ranks, leaving its last commit in ``HPCREP_ELASTIC_DIR``
    (``out/commits``); a 3-rank launch resumes from it and finishes."""
    commits = out / "commits"
    commits.mkdir(parents=True)
    env = {"HPCREP_ELASTIC_DIR": str(commits)}
    stopped = run_job(venv, out, "--victim", str(VICTIM), "--kill-at", str(KILL_AT), env=env,
                      ulfm=False)
    assert stopped.returncode != 0 and (out / "death").exists(), \
        stopped.stdout[-3000:] + stopped.stderr[-3000:]
    resumed = run_job(venv, out, env=env, ranks=RANKS - 1, ulfm=False)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    result = json.loads((out / "rank0.json").read_text())
    assert [at[:2] for at in result["resumes"]] == [[0, KILL_AT * RANKS * BATCH]], result
    return np.load(out / "weights-rank0.npz")


@pytest.mark.timeout(300)
def test_hpcrep_run_elastic_on_open_mpi_5_goes_on_and_grows_back_to_max_np(ulfm_venv, scratch):
    """``hpcrep run --elastic --max-np 4`` with Open MPI 5's mpirun (found beside .venv-ulfm's
    Python) starts the job with fault tolerance on and the detector: the survivors of a killed
    rank go on in it (no relaunch), and at their next commit the job spawns a rank into the
    freed slot and goes on with 4 ranks, which end with equal weights, every row trained once."""
    job = elastic_job(ulfm_venv, scratch, "--victim", str(VICTIM), "--kill-at", str(KILL_AT))
    argv = [job[0], "-m", "hpcrep.cli", "run", "-np", str(RANKS), "--elastic", "--max-np",
            str(RANKS), *job[1:]]
    env = job_env(HPCREP_ULFM_DETECT_TIMEOUT="3")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "recovery in place (ULFM" in done.stderr, output
    assert f"hpcrep: rank(s) {VICTIM} of {RANKS} failed; {RANKS - 1} survivors go on" \
        in done.stderr, output
    assert f"hpcrep: the job grew from {RANKS - 1} to {RANKS} ranks" in done.stderr, output
    assert "relaunching" not in done.stderr, output
    survivors = [r for r in range(RANKS) if r != VICTIM]
    names = [f"rank{r}" for r in survivors] + [f"grown{RANKS - 1}"]
    assert sorted(p.stem for p in scratch.glob("*.json") if p.stem != "victim_fed") == \
        sorted(names), output
    results = [json.loads((scratch / f"{n}.json").read_text()) for n in names]
    # 4 ranks again, the spawned one last; every rank took part in the one growth
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), results
    assert {r["size"] for r in results} == {RANKS}, results
    assert results[-1]["spawned"] and results[-1]["rank"] == RANKS - 1, results[-1]
    for res in results[:-1]:
        assert [(g["old_size"], g["new_size"]) for g in res["growths"]] == \
            [(RANKS - 1, RANKS)], res["growths"]
    # equal weights; every row of every epoch trained on once, by 3 or 4 ranks
    check_weights_and_rows(scratch, names, results, RANKS)
    # the last epoch ran on 4 ranks: every rank fed rows in it
    assert all(any(f[0] == EPOCHS - 1 for f in r["fed"]) for r in results), "a rank idle"
    grew = results[0]["growths"][0]
    print(f"\nULFM elastic: grew back from {RANKS - 1} to {RANKS} ranks at a commit: spawn + "
          f"merge {grew['spawn_seconds']:.2f} s, new world {grew['rebuild_seconds'] * 1e3:.0f} ms")


@pytest.mark.timeout(300)
def test_a_rank_lost_while_the_job_grows_ends_it_and_hpcrep_run_relaunches_it(ulfm_venv,
                                                                             scratch):
    """Rank 1 SIGKILLed as the survivors of rank 2 begin to spawn a rank back into its slot:
    a job cannot shrink inside ``MPI_Comm_spawn`` (its root would wait for good), so a survivor
    raises ``GrowFailedError``, which ends the job, and ``hpcrep run --elastic`` relaunches it
    from the last commit; the relaunch loses rank 2 again, grows back to 4 and finishes."""
    job = elastic_job(ulfm_venv, scratch, "--victim", str(VICTIM), "--kill-at", str(KILL_AT),
                      "--kill-in-grow", "1")
    argv = [job[0], "-m", "hpcrep.cli", "run", "-np", str(RANKS), "--elastic", "--max-np",
            str(RANKS), *job[1:]]
    env = job_env(HPCREP_ULFM_DETECT_TIMEOUT="3")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert (scratch / "killed-in-grow").exists(), output
    assert "GrowFailedError: a rank failed while the job grew back from 3 ranks (spawning 1 " \
        "on" in done.stderr, output
    assert "relaunching 4 rank(s) on this machine from the last commit (relaunch 1 of" \
        in done.stderr, output
    assert f"hpcrep: the job grew from {RANKS - 1} to {RANKS} ranks" in done.stderr, output
    names = [f"rank{r}" for r in range(RANKS) if r != VICTIM] + [f"grown{RANKS - 1}"]
    results = [json.loads((scratch / f"{n}.json").read_text()) for n in names]
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), results
    assert {r["size"] for r in results} == {RANKS}, results
    weights = [np.load(scratch / f"weights-{n}.npz") for n in names]
    for other in weights[1:]:
        assert_same_weights(weights[0], other)


@pytest.mark.timeout(300)
def test_survivors_below_min_np_stop_with_a_message_and_leave_the_commit(ulfm_venv, scratch):
    """``HPCREP_ELASTIC_MIN_NP=4`` (``hpcrep run --elastic --min-np 4``): when rank 2 is killed
    the 3 survivors do not go on; they say why and exit 76, and the last commit is on disk."""
    commits = scratch / "commits"
    done = run_job(ulfm_venv, scratch, "--victim", str(VICTIM), "--kill-at", str(KILL_AT),
                   env={"HPCREP_ELASTIC_MIN_NP": str(RANKS), "HPCREP_ELASTIC_DIR": str(commits)})
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode != 0, output
    assert f"hpcrep: only {RANKS - 1} of {RANKS} ranks survived (ranks {VICTIM} lost), fewer " \
        f"than HPCREP_ELASTIC_MIN_NP={RANKS}: the job stops; the last commit is in {commits}" \
        in done.stderr, output
    assert not list(scratch.glob("rank*.json")), "a survivor went on"
    assert [p.name for p in commits.iterdir()] == ["elastic-state-0.npz"], output


def first_step_after_resume(stderr: str, death: float) -> float:
    """Seconds from ``death`` to the first step a survivor ended after its ``fit`` began again
    (transparent_elastic_job.py prints both on stderr)."""
    begins = sorted(float(t) for t in re.findall(r"train begin ([0-9.]+)", stderr))
    resumed = min(t for t in begins if t > death)
    ends = sorted(float(t) for t in re.findall(r"step end ([0-9.]+)", stderr))
    return min(t for t in ends if t > resumed) - death


@pytest.mark.timeout(300)
def test_the_default_hpcrep_run_elastic_recovers_in_place_with_the_projects_ulfm_mpi(ulfm_venv,
                                                                                     scratch):
    """``hpcrep run --elastic`` from the default install (.venv: Open MPI 4.1, no ULFM) finds
    the project's .venv-ulfm, says so, and runs the job under it: a SIGKILLed rank's survivors
    shrink and go on in the same job (no relaunch), and the launcher exits 0."""
    script = str(HERE / "transparent_elastic_job.py")
    argv = [str(ROOT / ".venv" / "bin" / "python"), "-m", "hpcrep.cli", "run", "-np",
            str(RANKS), "--elastic", script, str(scratch)]
    env = job_env(KILL_RANK=str(VICTIM), KILL_AT="10", HPCREP_ELASTIC_RECOVERY="auto")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env,
                          cwd=scratch)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert f"running under {ulfm_venv / 'bin' / 'python'}" in done.stderr, output
    assert "hpcrep run: elastic: recovery in place (ULFM" in done.stderr, output
    assert "hpcrep: fit goes on at epoch 2 on 3 ranks" in done.stderr, output
    assert "relaunching" not in done.stderr, output
    took = first_step_after_resume(done.stderr, float((scratch / "death").read_text()))
    print(f"\ndefault hpcrep run --elastic: rank {VICTIM} of {RANKS} SIGKILLed; first step of "
          f"the survivors {took:.3f} s after")
    assert took < 30, took


@pytest.mark.timeout(300)
@pytest.mark.parametrize("batches_per_commit", [0, 4], ids=["epoch-commits", "batch-commits"])
def test_transparent_fit_goes_on_after_a_killed_rank(ulfm_venv, scratch, batches_per_commit):
    """``python -m hpcrep --elastic`` runs an unchanged Keras ``fit``; a rank SIGKILLed before
    batch 10 of the second epoch: the survivors go back to the end of the first (or, with
    ``HPCREP_ELASTIC_BATCHES_PER_COMMIT=4``, to the commit after batch 8 of the second: its first
    8 x 4 x 32 rows), reshard, finish the 3 epochs. ``HPCREP_ELASTIC_MAX_NP`` (what ``hpcrep run
    --max-np`` sets) leaves it on 3 ranks: only ``@hvd.elastic.run`` grows back (a commit that
    asked to grow used to end the script).

    The kill costs nothing but the steps after the commit: the survivors end with bitwise the
    weights of a planned resize, the same job stopped by the same kill without ULFM and resumed
    on 3 ranks from the commit it left on disk (:func:`planned_resize`)."""
    argv = mpirun_command(RANKS, transparent_job(ulfm_venv, scratch),
                          mpirun=str(ulfm_venv / "bin" / "mpirun"),
                          extra=["--with-ft", "ulfm", *DETECTOR, "-x", "KILL_RANK", "-x",
                                 "KILL_AT", "-x", "HPCREP_ELASTIC_MAX_NP", "-x",
                                 "HPCREP_ELASTIC_BATCHES_PER_COMMIT"])
    env = job_env(KILL_RANK=str(VICTIM), KILL_AT="10", HPCREP_ELASTIC_MAX_NP=str(RANKS),
                  HPCREP_ELASTIC_BATCHES_PER_COMMIT=str(batches_per_commit))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "fit goes on after a failed rank" in done.stderr, output  # the start-up line
    if batches_per_commit:
        assert "commits every 4 batches of array input" in done.stderr, output
        assert f"hpcrep: fit goes on in epoch 2 on 3 ranks (from the commit after row " \
            f"{8 * RANKS * 32} of epoch 2;" in done.stderr, output
    else:
        assert "hpcrep: fit goes on at epoch 2 on 3 ranks (from the commit at the end of " \
            "epoch 1;" in done.stderr, output
    # printing stays on rank 0; the History holds the 3 epochs of both attempts
    lines = [line for line in done.stdout.splitlines() if line.startswith("epochs logged")]
    assert len(lines) == 1 and lines[0].startswith("epochs logged 3; test accuracy"), output
    assert float(lines[0].rsplit(" ", 1)[1]) > 0.6, lines
    survivors = [r for r in range(RANKS) if r != VICTIM]
    assert sorted(p.name for p in scratch.glob("weights*.npz")) == \
        [f"weights{r}.npz" for r in survivors], output
    weights = [np.load(scratch / f"weights{r}.npz") for r in survivors]
    for other in weights[1:]:
        assert_same_weights(weights[0], other)
    took = first_step_after_resume(done.stderr, float((scratch / "death").read_text()))
    planned = planned_resize(ulfm_venv, scratch / "planned", batches_per_commit)
    assert_same_weights(weights[0], planned, "the survivors' weights are not those of the "
                        "planned resize")
    print(f"\ntransparent elastic fit ({batches_per_commit} batches per commit): rank {VICTIM} "
          f"of {RANKS} SIGKILLed in epoch 2; first step of the survivors {took:.3f} s after")
    assert took < 30, took


def planned_resize(venv: Path, out: Path, batches_per_commit: int) -> np.lib.npyio.NpzFile:
    """Run test_transparent_fit_goes_on_after_a_killed_rank's job as a planned change from 4
    ranks to 3 and return rank 0's final weights: the same kill, without ULFM, ends the job on
    4 ranks, leaving its last commit in ``HPCREP_ELASTIC_DIR`` (``out/commits``); a 3-rank
    launch resumes from it and finishes."""
    commits = out / "commits"
    commits.mkdir(parents=True)
    job = transparent_job(venv, out)
    env = job_env(KILL_RANK=str(VICTIM), KILL_AT="10", HPCREP_ELASTIC_DIR=str(commits),
                  HPCREP_ELASTIC_BATCHES_PER_COMMIT=str(batches_per_commit))
    passed = ["-x", "HPCREP_ELASTIC_DIR", "-x", "HPCREP_ELASTIC_BATCHES_PER_COMMIT"]
    stopped = subprocess.run(
        mpirun_command(RANKS, job, mpirun=str(venv / "bin" / "mpirun"),
                       extra=[*passed, "-x", "KILL_RANK", "-x", "KILL_AT"]),
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert stopped.returncode != 0 and (out / "death").exists(), \
        stopped.stdout[-3000:] + stopped.stderr[-3000:]
    resumed = subprocess.run(
        mpirun_command(RANKS - 1, job, mpirun=str(venv / "bin" / "mpirun"), extra=passed),
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    output = resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert resumed.returncode == 0, output
    assert f"hpcrep: fit resumes on {RANKS - 1} ranks from the commit " in resumed.stderr, output
    return np.load(out / "weights0.npz")


def equal_weights(out: Path, ranks: list[int]) -> None:
    """Assert that transparent_elastic_job.py's weight files of ``ranks`` (and no others) are
    there and equal."""
    assert sorted(p.name for p in out.glob("weights*.npz")) == \
        sorted(f"weights{r}.npz" for r in ranks)
    weights = [np.load(out / f"weights{r}.npz") for r in ranks]
    for other in weights[1:]:
        assert_same_weights(weights[0], other)


@pytest.mark.timeout(300)
def test_hpcrep_run_grows_a_transparent_fit_back_through_a_relaunch(ulfm_venv, scratch):
    """``hpcrep run -np 4 --elastic --max-np 4`` of an unchanged Keras script: rank 3 SIGKILLed
    in epoch 2; the survivors go on at epoch 2 on 3 ranks, and at that epoch's commit the freed
    slot makes every rank stop for a relaunch (transparent mode cannot spawn into the job), which
    resumes at epoch 3 on 4 ranks from the commit on disk: one hpcrep run, exit 0, one History
    of the 3 epochs, equal weights on the 4 ranks."""
    argv = [str(ulfm_venv / "bin" / "python"), "-m", "hpcrep.cli", "run", "-np", str(RANKS),
            "--elastic", "--max-np", str(RANKS), str(HERE / "transparent_elastic_job.py"),
            str(scratch)]
    env = job_env(HPCREP_ULFM_DETECT_TIMEOUT="3", KILL_RANK="3", KILL_AT="10")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env,
                          cwd=scratch)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    for line in (f"hpcrep: rank(s) 3 of {RANKS} failed; {RANKS - 1} survivors go on",
                 f"hpcrep: fit goes on at epoch 2 on {RANKS - 1} ranks",
                 "hpcrep: slots are free again (1 on ",
                 f"relaunching {RANKS} rank(s) on this machine from that commit",
                 f"hpcrep: fit resumes on {RANKS} ranks from the commit at the end of epoch 2 "):
        assert line in done.stderr, f"{line!r} missing:\n{output}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("epochs logged")]
    assert len(lines) == 1 and lines[0].startswith("epochs logged 3; test accuracy"), output
    assert float(lines[0].rsplit(" ", 1)[1]) > 0.6, lines
    equal_weights(scratch, list(range(RANKS)))
    assert not list(scratch.glob(".hpcrep-elastic-*"))  # hpcrep run's commits, removed at the end
