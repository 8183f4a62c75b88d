"""The stall watchdog's bookkeeping and its report, in one process: gaps mutation testing found.

`make mutation` runs one-process tests, and the watchdog had none: its tests
(tests/mpi/test_hierarchical_and_watchdog.py, and the abort tests) run MPI jobs. These check what
the watchdog records while a rank waits (``watching``, the probes of the compiled path) and the
text it prints before it aborts. Each test gets a fresh watchdog state whose watcher thread
counts as started, so no watcher runs on it.
"""

import threading
import time

import pytest

from hpcrep.comm import watchdog


@pytest.fixture
def state(monkeypatch):
    fresh = watchdog._State(thread=threading.current_thread())
    monkeypatch.setattr(watchdog, "_state", fresh)
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", "600")
    return fresh


def call(names=("a",), seq=1, kind="allreduce"):
    return watchdog._Call(kind, tuple(names), seq, 0.0, 600.0)


def test_what_names_up_to_three_tensors_and_counts_the_rest():
    assert watchdog._what(call(("a", "b", "c", "d", "e"), 7)) == (
        "collective allreduce of 'a', 'b', 'c' and 2 more (call #7 here)")
    assert watchdog._what(call(("a", "b", "c", "d"))) == (
        "collective allreduce of 'a', 'b', 'c' and 1 more (call #1 here)")
    assert watchdog._what(call(("a", "b", "c"))) == (
        "collective allreduce of 'a', 'b', 'c' (call #1 here)")
    assert watchdog._what(call((), 2, "barrier")) == (
        "collective barrier of no tensors (call #2 here)")


def test_ranks_are_grouped_by_host(state):
    state.hosts = ("n1", "n1", "n2", "n1")
    assert watchdog._ranks([0, 1, 3, 2]) == "ranks 0, 1, 3 on n1; rank 2 on n2"
    assert watchdog._ranks([2, 4]) == "rank 2 on n2; rank 4 on ?"  # a rank past the known hosts


def test_report_says_where_each_rank_waits_and_who_did_not_answer(state):
    state.hosts = ("n1", "n1", "n2", "n2")
    state.answers = {0: (4, "allreduce", ("g",)), 2: (4, "allreduce", ("g",)),
                     1: (3, "broadcast", ("w",))}
    lines = watchdog._report(call(("g",), 4), 612.4).split("\n")
    assert lines == [
        "collective allreduce of 'g' (call #4 here) has not completed after 612 s "
        "(HPCREP_STALL_TIMEOUT=600). Aborting the whole job.",
        "  waiting in call #4 (allreduce): rank 0 on n1; rank 2 on n2",
        "  waiting in call #3 (broadcast): rank 1 on n1",
        "  no answer from rank 3 on n2: not arrived at this collective (still computing, stuck "
        "outside hpcrep, dead) or cannot be reached (a failed node or network link)",
        "  If a step legitimately takes this long, raise HPCREP_STALL_TIMEOUT (0 turns the "
        "watchdog off).",
    ]


def test_report_without_answers_has_no_rank_lines(state):
    lines = watchdog._report(call(), 30.0).split("\n")
    assert len(lines) == 2 and lines[0].endswith("Aborting the whole job.")
    state.hosts = ("n1", "n2")
    state.answers = {0: (1, "allreduce", ("a",)), 1: (1, "allreduce", ("a",))}
    assert "no answer" not in watchdog._report(call(), 30.0)


def test_watching_records_the_call_for_its_duration_and_counts_calls(state):
    before = time.monotonic()
    with watchdog.watching("allgather", ["x", "y"]):
        c = state.call
        assert (c.kind, c.names, c.seq, c.timeout, c.warned) == ("allgather", ("x", "y"), 1,
                                                                 600.0, False)
        assert before <= c.started <= time.monotonic()
        assert state.owner == threading.get_ident()
        with watchdog.watching("inner", ["z"]):  # nested on this thread: the outer call stays
            assert state.call is c
        assert state.call is c and state.seq == 1
    assert state.call is None and state.owner is None
    with watchdog.watching("broadcast", []):
        assert state.call.seq == 2
    assert state.call is None


def test_the_record_is_cleared_even_when_the_block_raises(state):
    with pytest.raises(KeyError), watchdog.watching("allreduce", ["a"]):
        raise KeyError("boom")
    assert state.call is None and state.owner is None


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_timeout_of_zero_or_less_records_nothing(state, monkeypatch, value):
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", value)
    assert watchdog.stall_timeout() == float(value)
    with watchdog.watching("allreduce", ["a"]):
        assert state.call is None and state.seq == 0


def test_probes_report_the_oldest_wait_and_keep_it_across_checks(state):
    now = time.monotonic()
    waits = {"a": None, "b": None}
    watchdog.add_probe(lambda: waits["a"])
    watchdog.add_probe(lambda: waits["b"])
    assert watchdog._probed_call() is None and state.probed is None
    waits["a"] = ("allreduce", ["g1"], now - 5)
    waits["b"] = ("allreduce", ["g2"], now - 9)
    first = watchdog._probed_call()
    assert (first.kind, first.names, first.started, first.seq, first.timeout) == (
        "allreduce", ("g2",), now - 9, 1, 600.0)
    first.warned = True
    assert watchdog._probed_call() is first and first.warned  # the same wait: the same record
    waits["b"] = None
    second = watchdog._probed_call()
    assert second.names == ("g1",) and second.seq == 2 and not second.warned
    waits["a"] = None
    assert watchdog._probed_call() is None and state.probed is None


def test_the_watcher_thread_is_started_once_as_a_daemon(monkeypatch):
    fresh = watchdog._State()
    monkeypatch.setattr(watchdog, "_state", fresh)
    watchdog._ensure_thread()
    thread = fresh.thread
    watchdog._ensure_thread()
    assert fresh.thread is thread and thread.is_alive() and thread.daemon
    assert thread.name == "hpcrep-stall-watchdog"


def test_an_answer_that_arrives_after_the_query_window_is_in_the_report(state):
    """A peer that entered the collective a second or more later sends its status after this
    rank's query window closed (CI saw it on a loaded machine); the report must still count it as
    waiting, not as silent. Uses a real one-rank MPI communicator as the status channel.
    """
    from mpi4py import MPI

    state.comm = MPI.COMM_SELF.Dup()
    try:
        state.hosts = ("n1",)
        state.answers = {}
        watchdog._late_answers()  # no query ran: nothing is added
        assert state.answers == {}
        state.answers = {1: (3, "allreduce", ("g",))}  # heard in the window
        state.comm.send((4, "allreduce", ("g",)), dest=0, tag=watchdog._STATUS_TAG)  # late
        watchdog._late_answers()
        assert state.answers == {1: (3, "allreduce", ("g",)), 0: (4, "allreduce", ("g",))}
        assert not state.comm.iprobe(source=MPI.ANY_SOURCE, tag=watchdog._STATUS_TAG)
    finally:
        state.comm.Free()
