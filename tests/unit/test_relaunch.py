"""hpcrep run --elastic's relaunch decisions (hpcrep/launch/relaunch.py): when a failed job is
started again, where, and with how many ranks. The launches themselves are real MPI jobs in
tests/launch/test_elastic_relaunch.py; here the launcher is a function that writes commits."""

import os
import sys
import time

import pytest

from hpcrep.comm import hosts_back
from hpcrep.launch import relaunch, run_command
from hpcrep.launch.heal_watch import HealWatch
from hpcrep.launch.hosts import Host
from hpcrep.errors import LaunchOptionError

A, B = Host("node1", 2), Host("node2", 2)


def attempt(number=1, code=1, progressed=True):
    return relaunch.Attempt(number, code, 10.0, progressed)


def test_a_failed_attempt_that_committed_is_relaunched_on_the_reachable_hosts():
    d = relaunch.decide(attempt(), requested=4, reset_limit=3, min_np=1, reachable=[A])
    assert d.relaunch and d.ranks == 2 and d.hosts == (A,)
    d = relaunch.decide(attempt(), requested=4, reset_limit=3, min_np=1, reachable=[A, B])
    assert d.relaunch and d.ranks == 4 and d.hosts == (A, B)
    d = relaunch.decide(attempt(), requested=3, reset_limit=3, min_np=1, reachable=None)
    assert d.relaunch and d.ranks == 3 and d.hosts == ()


@pytest.mark.parametrize("kwargs, reachable, reason", [
    (dict(code=0), [A, B], "succeeded"),
    (dict(progressed=False), [A, B], "committed nothing new"),
    (dict(number=4), [A, B], "relaunched 3 time(s) already (--reset-limit 3)"),
    (dict(), [], "fewer than --min-np 1"),
])
def test_no_relaunch_without_progress_past_the_limit_or_without_hosts(kwargs, reachable, reason):
    d = relaunch.decide(attempt(**kwargs), requested=4, reset_limit=3, min_np=1,
                        reachable=reachable)
    assert not d.relaunch and reason in d.reason


def test_min_np_stops_a_relaunch_that_would_be_too_small():
    d = relaunch.decide(attempt(), requested=4, reset_limit=3, min_np=3, reachable=[A])
    assert not d.relaunch and "only 2 slot(s) on the hosts still reachable (node1)" in d.reason


def _launcher(codes, commit_on):
    """A launch function that returns ``codes`` in turn and writes a commit on the attempts in
    ``commit_on`` (1-based); records (ranks, hosts) of each call."""
    calls = []

    def launch(ranks, hosts, env):
        calls.append((ranks, tuple(hosts), env["HPCREP_ELASTIC_DIR"]))
        if len(calls) in commit_on:
            path = os.path.join(env["HPCREP_ELASTIC_DIR"], "elastic-state-0.npz")
            with open(path, "wb") as f:
                f.write(b"commit %d" % len(calls))
            st = os.stat(path)  # a distinct time even on a coarse clock
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + len(calls) * 10**9))
        return codes[len(calls) - 1]
    return launch, calls


def test_run_elastic_relaunches_until_success_and_removes_its_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launch, calls = _launcher([137, 0], commit_on={1, 2})
    lines = []
    code = relaunch.run_elastic(launch, 2, [], {}, reset_limit=3, min_np=1, log=lines.append)
    assert code == 0 and [c[0] for c in calls] == [2, 2]
    assert calls[0][2] == calls[1][2] and not os.path.exists(calls[0][2])
    assert any("relaunching 2 rank(s) on this machine" in line for line in lines)


def test_run_elastic_probes_hosts_and_keeps_a_given_directory(tmp_path):
    launch, calls = _launcher([1, 1, 0], commit_on={1, 2})
    given = str(tmp_path / "commits")
    os.makedirs(given)
    lines = []
    def probe(host):  # node2 never answers: a probe that fails stands for the launcher's
        return [sys.executable, "-c", "pass" if host.name == "node1" else "raise SystemExit(1)"]
    code = relaunch.run_elastic(launch, 4, [A, B], {"HPCREP_ELASTIC_DIR": given}, reset_limit=3,
                                min_np=2, probe_argv=probe, log=lines.append)
    assert code == 0
    assert [(c[0], c[1]) for c in calls] == [(4, (A, B)), (2, (A,)), (2, (A,))]
    assert os.path.isdir(given)  # the user's directory stays
    assert any("no longer reachable: node2" in line for line in lines)


def test_run_elastic_stops_at_the_reset_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launch, calls = _launcher([1, 1, 1, 1], commit_on={1, 2, 3, 4})
    lines = []
    assert relaunch.run_elastic(launch, 2, [], {}, reset_limit=2, min_np=1,
                                log=lines.append) == 1
    assert len(calls) == 3 and "--reset-limit 2" in lines[-1]
    assert os.path.isdir(calls[0][2])  # the last commit is kept for a manual resume


@pytest.mark.parametrize("argv, message", [
    (["-np", "2", "--min-np", "1"], "--min-np applies to --elastic"),
    (["-np", "2", "--elastic", "--min-np", "3"], "give a number from 1 to -np (2)"),
    (["-np", "2", "--elastic", "--reset-limit", "-1"], "give 0 or more"),
])
def test_bad_elastic_options_are_refused(tmp_path, argv, message):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(LaunchOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_command.build_launch(run_command.parse([*argv, str(script)]), environ={},
                                 mpirun="/usr/bin/mpirun")


def test_elastic_is_refused_under_srun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(LaunchOptionError, match="--elastic relaunches through mpirun"):
        run_command.build_launch(run_command.parse(["--elastic", str(script)]),
                                 environ={"SLURM_JOB_ID": "7"}, mpirun="/usr/bin/mpirun")


def test_a_host_whose_probe_hangs_is_unreachable_and_the_probe_is_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    # the probe starts a child of its own (as mpirun starts ssh) and both hang
    hang = ("import os, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")

    def probe(host):
        return [sys.executable, "-c", "pass" if host.name == "node1" else hang]

    assert relaunch.probe_hosts([A, B], probe, dict(os.environ), timeout=3) == [A]
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):  # gone with its group (reaped by init)
        for _ in range(50):
            os.kill(child, 0)
            time.sleep(0.1)


# Growing back onto a host a ULFM job lost (hpcrep.comm.hosts_back, hpcrep.launch.heal_watch).

def test_growth_relaunches_on_every_reachable_host_up_to_max_np():
    d = relaunch.decide_growth(attempt(code=0), max_np=4, requested=4, reachable=[A, B])
    assert d.relaunch and d.ranks == 4 and d.hosts == (A, B)
    d = relaunch.decide_growth(attempt(code=0), max_np=3, requested=2, reachable=[A, B])
    assert d.relaunch and d.ranks == 3
    d = relaunch.decide_growth(attempt(code=0), max_np=4, requested=4, reachable=None)
    assert d.relaunch and d.ranks == 4 and d.hosts == ()
    assert not relaunch.decide_growth(attempt(code=0, progressed=False), 4, 4, [A, B]).relaunch
    assert not relaunch.decide_growth(attempt(code=0), 4, 4, []).relaunch


def test_run_elastic_relaunches_a_job_that_stopped_to_grow_on_all_hosts(tmp_path):
    """The first attempt shrank to node1 and stopped at a commit asking to grow (what rank 0's
    grow.stop_to_relaunch writes), exit 0: the next attempt runs on both hosts at max_np, the
    request files are gone, and the reset limit (0) did not stop it."""
    given = str(tmp_path / "commits")
    os.makedirs(given)
    launch, calls = _launcher([0, 0], commit_on={1, 2})

    def stopping_launch(ranks, hosts, env):
        code = launch(ranks, hosts, env)
        if len(calls) == 1:
            hosts_back.publish_running(given, ["node1"])
            hosts_back.report_back(given, ["node2"])
            hosts_back.request_relaunch(given, ["node2"], size=2, max_size=4)
        return code

    lines = []
    code = relaunch.run_elastic(stopping_launch, 4, [A, B], {"HPCREP_ELASTIC_DIR": given},
                                reset_limit=0, min_np=1, probe_argv=lambda h: ["true"],
                                log=lines.append, max_np=4)
    assert code == 0 and [(c[0], c[1]) for c in calls] == [(4, (A, B)), (4, (A, B))]
    assert sorted(os.listdir(given)) == ["elastic-state-0.npz"]
    assert any("stopped at a commit to grow back" in line
               and "relaunching 4 rank(s) on node1:2, node2:2" in line for line in lines), lines


def test_the_job_sees_the_hosts_reported_back_that_run_none_of_its_ranks(tmp_path):
    """Hosts the job never ran on count too: a relaunch that found node1 unreachable started on
    node2 alone, and must grow onto node1 when it answers."""
    d = str(tmp_path)
    assert hosts_back.hosts_back(d, ["node1"]) == ()  # nothing reported
    hosts_back.report_back(d, ["node2.cluster", "node9"])
    assert hosts_back.hosts_back(d, ["node1"]) == ("node2", "node9")
    assert hosts_back.hosts_back(d, ["node1", "node2.cluster"]) == ("node9",)
    assert hosts_back.hosts_back(d, ["node1", "node2", "node9"]) == ()
    hosts_back.publish_running(d, ["node1", "node1.cluster"])
    assert hosts_back.running(d) == ["node1"]


def test_heal_watch_probes_only_hosts_without_ranks_and_reports_those_that_answer(tmp_path):
    d = str(tmp_path)
    probed, lines = [], []

    def probe(host):
        probed.append(host.name)
        return ["true"] if host.name == "node2" else ["false"]

    C = Host("node3", 2)
    watch = HealWatch(d, [A, B, C], probe, dict(os.environ), log=lines.append)
    assert watch.check_once() == () and probed == []  # the job has not shrunk: nothing probed
    hosts_back.publish_running(d, ["node1"])
    assert watch.check_once() == ("node2",) and sorted(probed) == ["node2", "node3"]
    assert hosts_back.hosts_back(d, ["node1"]) == ("node2",)
    assert len(lines) == 1 and "node2 answer(s) again" in lines[0]
    watch.check_once()
    assert len(lines) == 1  # said once
