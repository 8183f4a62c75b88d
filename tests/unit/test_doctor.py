"""The pure parts of ``hpcrep doctor``: parsing what MPI, srun and ``ip`` print, placing ranks,
judging the compiled op and the allreduce figures, and scoring results; and the checks that
need no MPI job (cores, network, Slurm) run on this machine."""

from __future__ import annotations

import json

import pytest

from hpcrep.comm.yield_policy import usable_cores
from hpcrep.errors import LaunchOptionError
from hpcrep.launch.doctor import allreduce, command, native, result, site
from hpcrep.launch.doctor.mpi import launcher_version, library_version
from hpcrep.launch.doctor.placement import Placement, ranks_per_host
from hpcrep.launch.hosts import Host

DEBIAN = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
FIGURES = {"size": 2, "hosts": ["vm", "vm"], "latency": 2e-6, "bandwidth": 8e8,
           "memcpy": 8e9, "correct": True, "bytes": 64 << 20, "load": 0.5, "cores": 2}


def test_versions_of_library_and_launcher():
    assert library_version(DEBIAN) == ("Open MPI", "4.1.4")
    assert library_version("MPICH Version:      4.1.2\nMPICH Release date: x") == ("MPICH",
                                                                                  "4.1.2")
    assert library_version("Some MPI 1.0") == ("unknown", "")
    assert launcher_version("mpirun (Open MPI) 5.0.11\n\nReport bugs") == ("Open MPI", "5.0.11")
    assert launcher_version("HYDRA build details:\n    Version:    4.1.2\n") == ("MPICH", "4.1.2")
    assert launcher_version("") == ("unknown", "")


def test_srun_plugin_list_parsed():
    text = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n\tpmix\nspecific pmix " \
           "plugin versions available: pmix_v4\n"
    assert site.srun_plugins(text) == ["none", "cray_shasta", "pmi2", "pmix"]
    assert site.srun_plugins("srun: MPI types are...\nsrun: mpi/none\nsrun: mpi/pmi2\n") == \
        ["none", "pmi2"]


IP = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
5: ib0    inet 10.1.0.7/16 brd 10.1.255.255 scope global ib0\\       valid_lft forever
"""


def test_interfaces_open_mpi_uses():
    found = site.interfaces(IP)
    assert found == [("lo", "127.0.0.1/8"), ("eth0", "192.0.2.2/24"), ("ib0", "10.1.0.7/16")]
    assert site.tcp_interfaces(found, "", "") == found[1:]  # default: all but loopback
    assert site.tcp_interfaces(found, "10.1.0.0/16", "") == [("ib0", "10.1.0.7/16")]
    assert site.tcp_interfaces(found, "eth0,lo", "") == found[:2]
    assert site.tcp_interfaces(found, "", "lo,ib0") == [("eth0", "192.0.2.2/24")]


def test_mca_setting_from_arguments_before_environment():
    env = {"OMPI_MCA_btl_tcp_if_include": "eth0"}
    assert site.mca_setting("btl_tcp_if_include", ["--mca", "btl_tcp_if_include", "ib0"],
                            env) == "ib0"
    assert site.mca_setting("btl_tcp_if_include", [], env) == "eth0"
    assert site.mca_setting("btl_tcp_if_exclude", [], env) == ""


def test_ranks_fill_hosts_in_order():
    assert ranks_per_host(5, [Host("a", 4), Host("b", 4)]) == [4, 1]
    assert ranks_per_host(3, []) == [3]
    assert Placement(None, (Host("a", 2), Host("b", 3))).ranks == 5


def test_cores_warn_when_ranks_outnumber_them(monkeypatch):
    monkeypatch.delenv("HPCREP_THREADS", raising=False)
    cores = usable_cores()
    over = site.check_cores(Placement(4 * cores), environ={})
    assert over.status == result.WARN
    assert f"{4 * cores} ranks on a node of {cores} cores" in over.finding
    assert "mpi_yield_when_idle" in over.finding and f"-np {cores}" in over.fix
    assert site.check_cores(Placement(cores), environ={}).status == result.OK
    # 2 hosts of 4 slots: the busiest node has 4 ranks
    assert site.check_cores(Placement(5, (Host("a", 4), Host("b", 4))), cores=4).status == \
        result.OK


def test_cores_warn_when_threads_oversubscribe(monkeypatch):
    monkeypatch.setenv("HPCREP_THREADS", "4")
    found = site.check_cores(Placement(2), cores=4)
    assert found.status == result.WARN
    assert "HPCREP_THREADS=4 = 8 threads on 4 cores" in found.finding
    assert found.fix.startswith("set HPCREP_THREADS=2")


def test_network_warns_on_loopback_only_across_hosts():
    hosts = (Host("node-a.invalid", 2), Host("node-b.invalid", 2))
    found = site.check_network(Placement(4, hosts, "-H", ("--mca", "btl_tcp_if_include", "lo")),
                               environ={})
    assert found.status == result.WARN, found
    assert "only loopback" in found.finding and "btl_tcp_if_include" in found.fix
    local = site.check_network(Placement(2), environ={})
    assert local.status == result.OK and "shared memory" in local.finding


def test_slurm_skipped_without_srun(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    found = site.check_slurm("openmpi", environ={})
    assert found.status == result.SKIP
    assert "srun is not on PATH" in found.finding
    inside = site.check_slurm("openmpi", environ={"SLURM_JOB_ID": "7"})
    assert inside.status == result.FAIL and "PATH" in inside.fix


def test_native_judged_by_mode():
    base = {"library": "/x/_hpcrep_ops.openmpi4.so", "mpi": "openmpi4", "tensorflow": "2.21.0",
            "stamp": None, "error": ""}
    ok = native.judge({**base, "active": True, "reason": "the compiled op is active"}, "auto")
    assert ok.status == result.OK and "compiled path" in ok.finding
    reason = ("the Python path is active: the compiled op cannot be used: it failed to load "
              "(file too short); rebuild it")
    slow = native.judge({**base, "active": False, "reason": reason}, "auto")
    assert slow.status == result.WARN and "file too short" in slow.finding
    assert "python -m hpcrep.tensorflow.native.build" in slow.fix
    failed = native.judge({**base, "active": False, "reason": "", "error": "HPCREP_NATIVE=on "
                           "but the compiled op cannot be used"}, "on")
    assert failed.status == result.FAIL


def test_allreduce_judged():
    assert allreduce.judge(FIGURES, False).status == result.OK
    single = allreduce.judge({**FIGURES, "size": 1}, False, "srun")
    assert single.status == result.FAIL and "singleton" in single.finding
    assert allreduce.judge({**FIGURES, "correct": False}, False).status == result.FAIL
    slow = allreduce.judge({**FIGURES, "bandwidth": 1e6, "load": 9.0}, False)
    assert slow.status == result.WARN and "load average 9.0 on 2 cores" in slow.finding
    tcp = allreduce.judge(FIGURES, False, "mpirun", "tcp,self")
    assert tcp.status == result.WARN and "leaves out shared memory" in tcp.finding
    assert allreduce.shared_memory("self,sm,tcp") and allreduce.shared_memory("^openib")
    assert not allreduce.shared_memory("^vader,sm")


def test_probe_command_follows_the_placement():
    local = allreduce.probe_argv(Placement(4), "openmpi", mpirun="/usr/bin/mpirun",
                                 python="py")
    assert local[:3] == ["/usr/bin/mpirun", "-n", "2"] and "--host" not in local
    assert local[-5:] == ["py", "-P", "-m", "hpcrep.launch.doctor.allreduce_probe",
                          str(allreduce.NBYTES)]
    hosts = (Host("node-a.invalid", 2), Host("node-b.invalid", 2))
    across = allreduce.probe_argv(Placement(4, hosts), "openmpi", mpirun="/usr/bin/mpirun",
                                  python="py")
    assert across[across.index("--host") + 1] == "node-a.invalid:1,node-b.invalid:1"
    srun = allreduce.probe_argv(Placement(None, launcher="srun"), "openmpi", python="py")
    assert srun[:4] == ["srun", "--mpi=pmix", "--ntasks", "2"]


def test_results_scored_and_printed():
    checks = [result.Result("a", result.OK, "fine"), result.Result("b", result.WARN, "slow", "x")]
    assert result.exit_code(checks) == 0
    assert result.line(checks[1]) == "warn b: slow; fix: x"
    assert "1 ok, 1 warn" in result.summary(checks)
    failed = checks + [result.Result("c", result.FAIL, "broken", "fix it")]
    assert result.exit_code(failed) == 1
    assert result.line(failed[2]).startswith("FAIL c: broken")
    doc = json.loads(result.to_json(failed))
    assert doc["exit_code"] == 1 and [c["status"] for c in doc["checks"]] == ["ok", "warn", "fail"]
    with pytest.raises(ValueError, match="status 'bad'"):
        result.Result("d", "bad", "")


def test_doctor_options_refuse_bad_placements():
    assert command.placement_of(command.parse(["-np", "3"]), environ={}).ranks == 3
    with pytest.raises(LaunchOptionError, match="more ranks than the 2 slots"):
        command.placement_of(command.parse(["-np", "3", "-H", "a:1,b:1"]), environ={})
    inside = command.placement_of(command.parse([]), environ={"SLURM_JOB_ID": "7"})
    assert inside.launcher == "srun"
