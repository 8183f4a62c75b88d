"""hvd.elastic's restart-from-commit without a driver: a rank fails, the whole job aborts (no
hang), and the same command with the same HPCREP_ELASTIC_DIR resumes from the last commit and
ends with the weights of a run that never failed."""

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from hpcrep.checkpoint import commit_file

JOB = str(Path(__file__).with_name("elastic_job.py"))


def test_failed_rank_then_relaunch_resumes_from_last_commit(mpirun, scratch):
    hpcrep = [mpirun.python, "-m", "hpcrep", JOB]
    elastic_dir, out = os.path.join(scratch, "state"), os.path.join(scratch, "resumed.npz")
    env = {"HPCREP_ELASTIC_DIR": elastic_dir}
    failed = mpirun.run(2, [*hpcrep, "--fail-at", "3", "--out", out], timeout=180, env=env)
    assert failed.returncode != 0
    assert "injected failure at epoch 3" in failed.stdout + failed.stderr
    assert not os.path.exists(out)
    resumed = mpirun.run(2, [*hpcrep, "--out", out], timeout=180, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rank 0 starts at epoch 3" in resumed.stdout  # (the runner prints rank 0 only)

    clean_out = os.path.join(scratch, "clean.npz")
    clean = mpirun.run(2, [*hpcrep, "--out", clean_out], timeout=180,
                       env={"HPCREP_ELASTIC_DIR": os.path.join(scratch, "clean-state")})
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "rank 0 starts at epoch 0" in clean.stdout
    a, b = np.load(out), np.load(clean_out)
    for key in a.files:  # weights, and (through the commit) SGD momentum, carried over
        np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7)


PAYLOAD = "open({marker!r}, 'w').close()"


class _Payload:
    """Unpickled, it creates ``marker``: code run by loading a planted file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (PAYLOAD.format(marker=self.marker),))


@pytest.mark.parametrize("planted", ["old_pickle", "npz_object_array", "group_writable"])
def test_a_job_refuses_a_planted_commit_and_runs_none_of_it(mpirun, scratch, planted):
    """A file put into HPCREP_ELASTIC_DIR that would run code if unpickled (the old pickle
    commit's name, or a .npz whose object array is a pickle), or a real commit in a directory
    others can write: the job's resume refuses it on rank 0 with the reason on stderr and ends
    non-zero, without a hang, and the payload never ran."""
    elastic_dir = Path(scratch) / "state"
    elastic_dir.mkdir(mode=0o700)
    marker, out = Path(scratch) / "payload-ran", os.path.join(scratch, "out.npz")
    commit = elastic_dir / "elastic-state-0.npz"
    if planted == "old_pickle":
        (elastic_dir / "elastic-state-0.pkl").write_bytes(pickle.dumps(_Payload(str(marker))))
        expected = "elastic-state-0.pkl is an elastic commit in the old pickle format"
    elif planted == "npz_object_array":
        carrier = np.empty(1, object)
        carrier[0] = _Payload(str(marker))
        with open(commit, "wb") as f:
            np.savez(f, commit_json=np.frombuffer(b"{}", np.uint8), value_00000=carrier)
        expected = f"elastic commit {commit} is refused"
    else:
        commit_file.write(str(commit), [], {"epoch": 4})
        os.chmod(elastic_dir, 0o777)
        expected = f"refusing to load the elastic commit {commit}: its directory"
    run = mpirun.run(2, [mpirun.python, "-m", "hpcrep", JOB, "--epochs", "1", "--out", out],
                     timeout=180, env={"HPCREP_ELASTIC_DIR": str(elastic_dir),
                                       "HPCREP_FLIGHT_DIR": scratch})  # its abort dump
    assert run.returncode != 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert expected in run.stderr, run.stderr[-3000:]
    assert not marker.exists() and not os.path.exists(out)
