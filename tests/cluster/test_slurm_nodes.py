"""Slurm across the nodes: a job rendered by ``hpcrep slurm render`` runs 4 ranks on 2 hosts, and
``hpcrep run`` inside a 2-node allocation runs an unchanged Keras script in transparent mode."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from hpcrep.slurm import JobOptions, render

# Relative to the repository, where the jobs start (sbatch --chdir).
PROBE_TOPOLOGY = "tests/cluster/topology_probe.py"
PROBE_TRANSPARENT = "tests/launch/probe.py"


def sbatch_wait(cluster, script: str, tmp_path, timeout: float = 300) -> str:
    """Submit ``script`` with ``sbatch --wait`` from the repository; return the job's output."""
    path = tmp_path / "job.sh"
    path.write_text(script)
    try:
        done = subprocess.run(["sbatch", "--wait", "--chdir", str(cluster.root), str(path)],
                              capture_output=True, text=True, timeout=timeout,
                              env=cluster.env())
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", "--user=root"], env=cluster.env())
        pytest.fail(f"the Slurm job did not finish in {timeout} s")
    out = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
    assert done.returncode == 0, f"sbatch --wait: {done.stdout}{done.stderr}\n{out[-4000:]}"
    return out


@pytest.mark.timeout(320)
def test_rendered_job_runs_four_ranks_on_two_hosts(cluster, tmp_path):
    script = render(JobOptions(command=(sys.executable, PROBE_TOPOLOGY), job_name="two nodes",
                               nodes=2, tasks_per_node=2, time="5",
                               output=str(tmp_path / "out.txt")))
    out = sbatch_wait(cluster, script, tmp_path)
    print(out)
    ranks = sorted((json.loads(o) for o in re.findall(r"\{[^{}]*\}", out)),
                   key=lambda r: r["rank"])
    assert [(r["host"], r["rank"], r["size"]) for r in ranks] == [
        ("node1", 0, 4), ("node1", 1, 4), ("node2", 2, 4), ("node2", 3, 4)], out
    assert [(r["local_rank"], r["cross_rank"]) for r in ranks] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # The nodes share this machine's cores: the fixture's task prolog makes waiting ranks yield
    # (else they spin and take the core from the ranks they wait for).
    assert [r["yield"] for r in ranks] == ["1"] * 4, out


@pytest.mark.timeout(320)
def test_hpcrep_run_in_a_two_node_allocation_trains_transparently(cluster, tmp_path):
    hpcrep = [sys.executable, "-m", "hpcrep.cli", "run"]
    job = str(cluster.root / "jobs" / "transparent_fit_numpy.py")  # absolute: probe.py chdirs
    argv = [*hpcrep, PROBE_TRANSPARENT, str(tmp_path / "probe"), job, "--rows", "2048",
            "--epochs", "2"]
    script = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n"
              f"#SBATCH --output={tmp_path / 'out.txt'}\nset -e\nhostname\n"
              + " ".join(argv) + "\n")
    out = sbatch_wait(cluster, script, tmp_path)
    assert "hpcrep transparent mode: 4 rank(s)" in out, out[-4000:]
    weights = [np.load(tmp_path / "probe" / f"rank{r}.npz") for r in range(4)]
    for other in weights[1:]:
        for key in weights[0].files:
            np.testing.assert_array_equal(other[key], weights[0][key], err_msg=key)
    first, last = map(float, re.findall(r"train loss ([\d.]+) -> ([\d.]+)", out)[0])
    assert last < first, out[-2000:]
