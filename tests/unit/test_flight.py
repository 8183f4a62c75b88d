"""The flight recorder in one process: what it records, how histories are compared, the file.

The MPI side (every rank's file after a planted mismatch) is tests/mpi/test_mismatch.py; the
stall watchdog's summary is tests/launch/test_watchdog_abort.py.
"""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from hpcrep.comm import flight


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(flight, "_state", flight._State())
    monkeypatch.setenv("HPCREP_FLIGHT_RECORDER", "4")
    monkeypatch.setenv("HPCREP_FLIGHT_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    return tmp_path


def issue(kind, names=(), arrays=(), group="world"):  # the user's line, as far as flight knows
    with flight.recording(kind, names, arrays, group):
        pass


def test_records_each_call_with_shapes_caller_and_times_and_keeps_the_last_n(fresh):
    a, b = np.zeros((3, 4), np.float32), np.zeros(2, np.int64)
    issue("allreduce", ["g.0", "g.1"], [a, b])
    with flight.recording("broadcast", ["w"], [a]):
        with flight.recording("allreduce", ["inner"], [a]):  # nested on this thread: not counted
            pass
        inside = flight.entries()[-1]
        assert (inside.kind, inside.end) == ("broadcast", None)  # in flight until the block ends
    first, second = flight.entries()
    assert (first.call, first.kind, first.names, first.count) == (1, "allreduce", ("g.0", "g.1"), 2)
    assert first.shapes == ("float32[3, 4]", "int64[2]")
    assert first.frame.startswith(__file__) and first.frame.endswith(" in issue")
    assert first.thread == threading.current_thread().name and first.group == "world"
    assert first.start <= first.end <= second.start <= second.end
    for _ in range(5):
        issue("barrier")
    assert [e.call for e in flight.entries()] == [4, 5, 6, 7]  # capacity 4: the oldest forgotten


def test_off_records_nothing_and_writes_nothing(fresh, monkeypatch):
    monkeypatch.setenv("HPCREP_FLIGHT_RECORDER", "0")
    issue("allreduce", ["g"], [np.zeros(2)])
    assert flight.entries() == [] and flight.dump(0, "test") is None
    assert list(fresh.iterdir()) == []


def test_dump_writes_the_ring_atomically_as_json(fresh):
    issue("allreduce", ["g"], [np.zeros(2, np.float32)], group="process set 1")
    path = flight.dump(3, "stall warning", {"kind": "allreduce", "waited_s": 2.0})
    assert path == str(fresh / "hpcrep-flight-77-rank3.json")
    record = json.loads(Path(path).read_text())
    assert (record["rank"], record["reason"], record["in_flight"]["kind"]) == (
        3, "stall warning", "allreduce")
    (entry,) = record["entries"]
    assert (entry["kind"], entry["names"], entry["shapes"], entry["group"]) == (
        "allreduce", ["g"], ["float32[2]"], "process set 1")
    assert [p.name for p in fresh.iterdir()] == ["hpcrep-flight-77-rank3.json"]  # no temp left


def test_without_a_flight_dir_a_jobs_files_go_to_one_directory_of_its_own(fresh, monkeypatch,
                                                                          tmp_path):
    """Every abort used to leave hpcrep-flight-*.json files beside the user's own in the working
    directory; now they gather in hpcrep-flight-<job>/."""
    monkeypatch.delenv("HPCREP_FLIGHT_DIR")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    issue("allreduce", ["g"], [np.zeros(2)])
    paths = [flight.dump(r, "abort") for r in (0, 1)]
    assert paths == [str(work / "hpcrep-flight-77" / f"rank{r}.json") for r in (0, 1)]
    assert [p.name for p in work.iterdir()] == ["hpcrep-flight-77"]
    assert json.loads(Path(paths[1]).read_text())["rank"] == 1


def test_an_unwritable_directory_is_reported_not_raised(fresh, monkeypatch, capsys):
    (fresh / "a-file").write_text("")  # a directory cannot be made below it (even as root)
    monkeypatch.setenv("HPCREP_FLIGHT_DIR", str(fresh / "a-file" / "dir"))
    issue("barrier")
    assert flight.dump(1, "job abort") is None
    assert "could not write the flight recorder" in capsys.readouterr().err


def h(*calls):
    """A history: (call, kind, shape) per call."""
    return tuple((c, (kind, 1, (shape,)), f"{kind} of 'x{c}'") for c, kind, shape in calls)


def test_first_divergence_by_signature_not_name():
    same = h((1, "allreduce", "float32[4]"), (2, "broadcast", "float32[2]"))
    renamed = tuple((c, sig, brief.replace("x", "y")) for c, sig, brief in same)
    assert flight.first_divergence({0: same, 1: renamed}) is None
    skipped = h((1, "allreduce", "float32[4]"), (2, "allreduce", "float32[8]"))
    assert flight.first_divergence({0: same, 1: skipped, 2: same}) == (
        2, {0: "broadcast of 'x2'", 1: "allreduce of 'x2'", 2: "broadcast of 'x2'"})
    text = flight.divergence_text({0: same, 1: skipped, 2: same}, ("n1", "n1", "n2"))
    assert text == ("the histories first differ at call #2: ranks 0, 2 on n1, n2: broadcast of "
                    "'x2'; rank 1 on n1: allreduce of 'x2'")


def test_a_rank_behind_the_others_diverges_where_it_stopped():
    ahead = h((3, "allreduce", "f[1]"), (4, "allreduce", "f[1]"), (5, "barrier", "-"))
    behind = h((3, "allreduce", "f[1]"), (4, "allreduce", "f[1]"))
    call, what = flight.first_divergence({0: ahead, 1: behind})
    assert call == 5 and what[0] == "barrier of 'x5'"
    assert what[1] == "nothing yet (its last call: #4)"
    # rings forget the oldest: compare from the oldest call every rank still holds
    assert flight.first_divergence({0: ahead[1:], 1: behind}) == (5, {0: what[0], 1: what[1]})
    assert "agree (last call #4)" in flight.divergence_text({0: behind, 1: behind})


def test_histories_restart_after_a_reported_mismatch(fresh, monkeypatch):
    class Comm:  # one rank's view of mismatch()'s allgather
        def allgather(self, mine):
            return [mine, mine]

        def Get_rank(self):
            return 1

    issue("allreduce", ["a"], [np.zeros(2)])
    issue("allreduce", ["b"], [np.zeros(3)])
    assert [c for c, _, _ in flight.history()] == [1, 2]
    flight.mismatch(Comm())
    assert flight.history() == ()
    issue("barrier")
    assert [(c, brief) for c, _, brief in flight.history()] == [(1, "barrier of no tensors")]
