"""Run the collective suite on every rank of an MPI job and agree on each test's outcome.

Every rank runs the same tests in the same order. After each test the ranks exchange outcomes
(on a harness communicator of their own), so a failure on any rank fails the test on all ranks
and rank 0 reports which ranks failed and why. Only rank 0 prints; it also prints how many ranks
ran. A test stuck in a collective hits the per-test timeout, whose 'thread' method exits the
process, and mpirun then takes the job down: a hang fails the run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import sys
import tempfile

import pytest

import hpcrep.comm as hc
from hpcrep.comm import collectives as comm_collectives

# Names that never meet fail after HPCREP_MATCH_TIMEOUT (30 s by default) of silence: the suite
# waits that long once (test_order_by_name), so it runs with 10 s. Every rank sets the same.
os.environ.setdefault("HPCREP_MATCH_TIMEOUT", "10")
hc.init()
from mpi4py import MPI  # noqa: E402 - after hpcrep initialised MPI

_HARNESS = MPI.COMM_WORLD.Dup()
RANK, SIZE = _HARNESS.Get_rank(), _HARNESS.Get_size()


def pytest_configure(config):
    config.option.timeout_method = "thread"
    if RANK != 0:
        # Other ranks stay silent; their failures are reported by rank 0.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def pytest_report_header(config):
    return f"hpcrep MPI suite: {SIZE} rank(s), {hc.mpi_library_version()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    mine = (report.outcome, str(report.longrepr) if report.failed else "")
    everyone = _HARNESS.allgather(mine)
    failed = [(r, text) for r, (state, text) in enumerate(everyone) if state == "failed"]
    if failed and not report.failed:
        report.outcome = "failed"
    if failed:
        report.longrepr = "\n".join(f"----- rank {r} of {SIZE} -----\n{text}" for r, text in failed)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = {k: len(v) for k, v in terminalreporter.stats.items() if k in ("passed", "failed",
                                                                             "skipped", "error")}
    everyone = _HARNESS.allgather((socket.gethostname(), counts))
    if RANK == 0:
        for r, (host, c) in enumerate(everyone):
            summary = ", ".join(f"{v} {k}" for k, v in sorted(c.items()))
            terminalreporter.write_line(f"hpcrep MPI suite rank {r}/{SIZE} on {host}: {summary}")


def pytest_sessionfinish(session, exitstatus):
    session.config.hpcrep_exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave the process here, once pytest has reported and MPI has ended: the interpreter's own
    teardown of everything the suite made (TensorFlow functions, graphs, Keras models) kept all 4
    ranks busy for about 50 s after the full suite's summary in the gate of 2026-11-27 (5 s after
    36 tests). What a normal exit runs first still runs: the atexit handlers (hpcrep's compiled
    path stops its threads there) and MPI_Finalize."""
    status = getattr(config, "hpcrep_exit_status", None)
    if status is None:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    if not MPI.Is_finalized():
        MPI.Finalize()
    os._exit(status)


@pytest.fixture
def shared_dir():
    """A fresh directory that every rank sees (made by rank 0), removed after the test."""
    path = hc.broadcast_object(tempfile.mkdtemp(prefix="hpcrep-mpi-") if hc.rank() == 0 else None)
    yield path
    hc.barrier()
    if hc.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def world():
    """The (rank, size) of this process in hpcrep's world."""
    return hc.rank(), hc.size()


@pytest.fixture
def allreduces(monkeypatch):
    """The allreduces this rank enters during the test, each as the tuple of its tensors' names.

    Counts the real calls at hpcrep's MPI layer (every reduction, fused or not, is one
    ``allreduce`` collective there, however many MPI messages its buffers take); nothing is
    replaced. The test runs on the Python path (``HPCREP_NATIVE=off``), whose grouped allreduces
    all pass through that layer; the compiled path issues the same groups (tests/mpi/test_native.py
    checks it gives the same results)."""
    monkeypatch.setenv("HPCREP_NATIVE", "off")
    seen: list[tuple[str, ...]] = []
    real = comm_collectives.collective

    @contextlib.contextmanager
    def recording(kind, names=(), *args, **kwargs):
        if kind == "allreduce":
            seen.append(tuple(names))
        with real(kind, names, *args, **kwargs):
            yield

    monkeypatch.setattr(comm_collectives, "collective", recording)
    return seen


@pytest.fixture
def one_sided_windows(skip_missing):
    """Require MPI one-sided windows over the job (ParamStore, the asynchronous regime).

    Across nodes an MPI may lack them (Open MPI 4.1 over TCP): then the test skips. On one node
    every MPI this project supports has them (Open MPI 4.1 over shared memory), so their absence
    there is a broken install, and the skip is a ``missing:`` one that fails under CI=true.
    Collective: every rank creates and frees a small window (all get the same answer).
    """
    from hpcrep.comm.param_store import windows_available

    if windows_available(hc.comm()):
        return
    if hc.local_size() == hc.size():  # every rank on this node
        skip_missing("MPI one-sided windows on one node (this MPI cannot create a window over "
                     f"{hc.size()} local ranks; {hc.mpi_library_version().splitlines()[0]})")
    pytest.skip("this MPI cannot create one-sided windows across nodes (Open MPI 4.1 over TCP): "
                "the asynchronous regime runs within one node here")


@pytest.fixture(params=["window", "p2p"])
def param_store(request, monkeypatch):
    """Run the test against each parameter store of the asynchronous regime; returns its kind.

    ``window``: ``HPCREP_PARAM_STORE`` unset (``auto``), so the test also checks that auto picks
    the window store where windows exist; needs them (:func:`one_sided_windows`: skips across
    nodes without them, fails on one node under CI=true). ``p2p``: forced with
    ``HPCREP_PARAM_STORE=p2p`` (runs everywhere). Every rank sets the same value.
    """
    if request.param == "window":
        request.getfixturevalue("one_sided_windows")
        monkeypatch.delenv("HPCREP_PARAM_STORE", raising=False)
    else:
        monkeypatch.setenv("HPCREP_PARAM_STORE", "p2p")
    return request.param
