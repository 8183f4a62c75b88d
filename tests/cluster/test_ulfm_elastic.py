"""In-process elastic over ULFM across the 2-node fixture (Open MPI 5 from ``.venv-ulfm``,
``mpirun --with-ft ulfm`` with the unthreaded heartbeat detector): 2 nodes x 2 ranks
train a Keras model on Fashion-MNIST under ``@hvd.elastic.run`` (tests/launch/ulfm_elastic_job.py)
and lose rank 3 on node2 to SIGKILL or SIGSTOP, or all of node2 to a cut link. The ranks left
go on in the same mpirun from the last commit (with ``HPCREP_ELASTIC_MAX_NP=4`` the job grows
back onto node2 at the next commit), finish with equal weights, and mpirun exits 0;
after a cut, node2's side stops (no quorum) and the launcher supervisor ends the mpirun that
waits for node2's daemon. Under ``hpcrep run --elastic --max-np 4`` a cut node2 that is healed
rejoins the shrunk job through a relaunch from its commit. And ``python -m hpcrep --elastic``
(transparent mode) keeps an unchanged ``fit`` going on the ranks left after rank 3 is SIGKILLed
(tests/launch/transparent_elastic_job.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

JOB = "tests/launch/ulfm_elastic_job.py"
DETECTOR_TIMEOUT = 5
STALL_TIMEOUT = 20
DETECTOR = ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "false",
            "--mca", "mpi_ft_detector_period", "1",
            "--mca", "mpi_ft_detector_timeout", str(DETECTOR_TIMEOUT)]


@pytest.fixture(scope="module")
def ulfm_mpirun(cluster, skip_missing) -> str:
    venv = cluster.root / ".venv-ulfm"
    if not (venv / "bin" / "mpirun").exists():
        skip_missing(f"the Open MPI 5 / ULFM environment {venv} (make it with: make ulfm)")
    return str(venv / "bin" / "mpirun")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault", ["kill", "stop", "cut", "grow"])
def test_the_ranks_left_go_on_in_the_same_mpirun(cluster, ulfm_mpirun, tmp_path, fault):
    """grow: rank 3 SIGKILLed with HPCREP_ELASTIC_MAX_NP=4: the job spawns a rank into its free
    slot on node2 at the next commit and finishes on 4 ranks."""
    node2 = cluster.nodes[1]
    victim = ["--victim", "3", "--kill-at", "12"] + (["--stop"] if fault == "stop" else [])
    command = [str(cluster.root / ".venv-ulfm" / "bin" / "python"), JOB, "--out", str(tmp_path),
               "--rows", "8192", "--epochs", "3", "--commit-every", "4", "--print-steps",
               *(victim if fault != "cut" else [])]
    proc = cluster.popen(["-n", "4", "--map-by", "ppr:2:node", "--with-ft", "ulfm", *DETECTOR],
                         command, MPIRUN=ulfm_mpirun, HPCREP_STALL_TIMEOUT=str(STALL_TIMEOUT),
                         HPCREP_ELASTIC_MAX_NP="4" if fault == "grow" else "0",
                         PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                     os.environ.get("PYTHONPATH", "")]))
    lines: list[str] = []
    event = None
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line)
            if fault == "cut" and event is None and re.match(r"rank 0 step 30 ", line):
                cluster.fault("cut", node2)
                event = time.time()
            assert time.monotonic() < deadline, "".join(lines)[-4000:]
        proc.wait(timeout=60)
        ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if fault == "cut":
            cluster.fault("heal", node2)
            cluster.wait_until_nodes_run()  # for the tests after this one
    out = "".join(lines)
    assert proc.returncode == 0, out[-4000:]
    if fault != "cut":
        assert (tmp_path / "death").exists(), out[-4000:]  # the victim killed itself
        event = float((tmp_path / "death").read_text())
    assert event is not None, out[-4000:]
    kept = [0, 1, 2] if fault != "cut" else [0, 1]
    lost = "3" if fault != "cut" else "2, 3"
    assert f"hpcrep: rank(s) {lost} of 4 failed; {len(kept)} survivors go on" in out, out[-4000:]
    assert sorted(p.name for p in tmp_path.glob("rank*.json")) == \
        [f"rank{r}.json" for r in kept], out[-4000:]
    names = [f"rank{r}" for r in kept] + (["grown3"] if fault == "grow" else [])
    results = [json.loads((tmp_path / f"{n}.json").read_text()) for n in names]
    size = 4 if fault == "grow" else len(kept)
    for old, res in zip(kept + [3], results):
        assert (res["rank"], res["size"]) == (old, size), res
        assert res["accuracy"] > 0.6, res["accuracy"]
    if fault == "grow":
        assert "hpcrep: the job grew from 3 to 4 ranks (1 on node2;" in out, out[-4000:]
        assert results[-1]["host"] == node2 and results[-1]["spawned"], results[-1]
        grew = results[0]["growths"][0]
        print(f"\nULFM on the fixture: grew back onto {node2} at the next commit, spawn + "
              f"merge {grew['spawn_seconds']:.2f} s")
    weights = [np.load(tmp_path / f"weights-{n}.npz") for n in names]
    for other in weights[1:]:
        for key in weights[0].files:
            np.testing.assert_array_equal(weights[0][key], other[key])
    results = results[:len(kept)]  # the ranks that saw the failure
    first = max(min(t for t in r["step_ends"] if t > r["resumes"][1][2]) for r in results)
    noticed = max(r["recoveries"][0]["noticed"] for r in results) - event
    shrink = max(r["recoveries"][0]["shrink_seconds"] for r in results)
    bound = {"kill": 5, "grow": 5, "stop": DETECTOR_TIMEOUT + 5, "cut": STALL_TIMEOUT + 5}[fault]
    print(f"\nULFM on the fixture, {fault} ({node2}): the ranks left went on "
          f"{first - event:.2f} s after (noticed {noticed:.2f} s, revoke + shrink {shrink:.2f} "
          f"s; bound {bound} s); mpirun exited {ended - event:.1f} s after")
    assert first - event < bound, first - event


@pytest.mark.timeout(500)
def test_a_healed_node_rejoins_through_a_relaunch_from_the_commit(cluster, ulfm_mpirun,
                                                                   tmp_path):
    """``hpcrep run --elastic --max-np 4`` on Open MPI 5: node2 cut, node1's 2 ranks go on; node2
    healed: hpcrep run's probe finds it back, the job stops at its next commit and hpcrep run
    relaunches it on both nodes from that commit; it ends on 4 ranks (2 on node2) with equal
    weights, and hpcrep run exits 0."""
    node1, node2 = cluster.nodes[:2]
    python = str(cluster.root / ".venv-ulfm" / "bin" / "python")
    argv = [python, "-m", "hpcrep.cli", "run", "-np", "4", "-H", f"{node1}:2,{node2}:2",
            "--elastic", "--max-np", "4", f"--mpi-args={cluster.mpi_args(ulfm_mpirun)}", JOB,
            "--out", str(tmp_path), "--rows", "16384", "--epochs", "150", "--commit-every", "4",
            "--epochs-after-relaunch", "2", "--print-steps"]
    env = cluster.env(PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                  os.environ.get("PYTHONPATH", "")]),
                      HPCREP_STALL_TIMEOUT=str(STALL_TIMEOUT),
                      HPCREP_ULFM_DETECT_TIMEOUT=str(DETECTOR_TIMEOUT),
                      HPCREP_ELASTIC_DIR=str(tmp_path / "commits"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cluster.root, start_new_session=True)
    lines: list[tuple[float, str]] = []
    cut = healed = None
    try:
        deadline = time.monotonic() + 420
        for line in proc.stdout:
            lines.append((time.time(), line))
            if cut is None and re.match(r"rank 0 step 30 ", line):
                cluster.fault("cut", node2)
                cut = time.time()
            elif healed is None and "2 survivors go on" in line:
                time.sleep(5)
                cluster.fault("heal", node2)
                healed = time.time()
            assert time.monotonic() < deadline, "".join(text for _, text in lines)[-4000:]
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.fault("heal", node2)
        cluster.wait_until_nodes_run()  # for the tests after this one
    out = "".join(text for _, text in lines)

    def first(pattern: str) -> float:
        found = [t for t, text in lines if pattern in text]
        assert found, f"no {pattern!r} in:\n{out[-4000:]}"
        return found[0]

    assert proc.returncode == 0, out[-4000:]
    assert cut is not None and healed is not None, out[-4000:]
    assert "hpcrep: rank(s) 2, 3 of 4 failed; 2 survivors go on" in out, out[-4000:]
    reported = first(f"hpcrep run: elastic: {node2} answer(s) again")
    stopped = first(f"hpcrep: {node2} answer(s) again: the job stops at this commit (2 ranks)")
    relaunched = first("relaunching 4 rank(s) on " + f"{node1}:2, {node2}:2 from that commit")
    for _, text in lines:
        if text.startswith("hpcrep"):
            print(text.rstrip())
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(r["rank"], r["size"], r["first_size"]) for r in results] == \
        [(r, 4, 4) for r in range(4)], results
    assert [r["host"] for r in results] == [node1, node1, node2, node2], results
    resumed = results[0]["resumes"][0]  # the relaunched job began at the commit that stopped it
    assert (resumed[0], resumed[1]) > (0, 0), resumed
    assert all(r["accuracy"] > 0.6 for r in results), [r["accuracy"] for r in results]
    weights = [np.load(tmp_path / f"weights-rank{r}.npz") for r in range(4)]
    for other in weights[1:]:
        for key in weights[0].files:
            np.testing.assert_array_equal(weights[0][key], other[key])
    step4 = min(results[0]["step_ends"])
    print(f"\nULFM on the fixture, heal ({node2}): cut at rank 0's step 30, healed "
          f"{healed - cut:.1f} s later; hpcrep run found {node2} back {reported - healed:.1f} s "
          f"after the heal, the job stopped at a commit {stopped - reported:.1f} s after that, "
          f"first step on 4 ranks {step4 - stopped:.1f} s after the stop (the stopped job's "
          f"exit and the probe {relaunched - stopped:.1f} s, the relaunch "
          f"{step4 - relaunched:.1f} s; {step4 - healed:.1f} s after the heal; resumed at epoch "
          f"{resumed[0]}, row {resumed[1]})")


@pytest.mark.timeout(300)
def test_transparent_fit_goes_on_across_the_nodes(cluster, ulfm_mpirun, tmp_path):
    command = [str(cluster.root / ".venv-ulfm" / "bin" / "python"), "-m", "hpcrep", "--elastic",
               "tests/launch/transparent_elastic_job.py", str(tmp_path), "8192", "3"]
    done = cluster.mpirun(["-n", "4", "--map-by", "ppr:2:node", "--with-ft", "ulfm", *DETECTOR,
                           "-x", "KILL_RANK", "-x", "KILL_AT"], command, timeout=240,
                          MPIRUN=ulfm_mpirun, KILL_RANK="3", KILL_AT="20",
                          PYTHONPATH=os.pathsep.join([str(cluster.root),
                                                      os.environ.get("PYTHONPATH", "")]))
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    assert "hpcrep: fit goes on at epoch 2 on 3 ranks" in out, out[-4000:]
    assert re.search(r"epochs logged 3; test accuracy 0\.[6-9]", out), out[-4000:]
    weights = [np.load(tmp_path / f"weights{r}.npz") for r in (0, 1, 2)]
    for other in weights[1:]:
        for key in weights[0].files:
            np.testing.assert_array_equal(weights[0][key], other[key])
    death = float((tmp_path / "death").read_text())
    begins = sorted(float(t) for t in re.findall(r"train begin ([0-9.]+)", out))
    resumed = min(t for t in begins if t > death)
    first = min(float(t) for t in re.findall(r"step end ([0-9.]+)", out) if float(t) > resumed)
    print(f"\ntransparent elastic fit on the fixture: rank 3 (node2) SIGKILLed; first step of "
          f"the ranks left {first - death:.2f} s after")
    assert first - death < 5, first - death
