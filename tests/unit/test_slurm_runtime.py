"""One-process tests of what hpcrep.slurm knows about a running job: the variable table, the srun
command line and its PMI plugin, and requeue's refusals (the real requeue runs on the test
cluster: tests/slurm/test_cluster.py)."""

import pytest

from hpcrep import checkpoint
from hpcrep.errors import HpcrepError, SlurmError, SlurmOptionError
from hpcrep.slurm import environment, requeue, srun


def test_slurm_table_reads_typed_values():
    env = environment.slurm({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", "SLURM_PROCID": "x"})
    assert env.in_allocation and env.job_id == "12" and env.ntasks == 4 and env.procid is None
    assert not environment.slurm({}).in_allocation


def test_job_id_and_restart_count_come_from_the_table(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert environment.job_id() is None and environment.restart_count() == 0
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert environment.job_id() == "41" and environment.restart_count() == 2
    # hpcrep.checkpoint re-exports them: the same functions, not copies
    assert checkpoint.slurm_job_id is environment.job_id
    assert checkpoint.requeue is requeue.requeue


def test_srun_command_and_the_pmi_plugin_of_each_mpi():
    assert srun.mpi_plugin("openmpi") == "pmix" and srun.mpi_plugin("mpich") == "pmi2"
    assert srun.srun_command(4, ["python", "x.py"], "pmi2") == [
        "srun", "--mpi=pmi2", "--ntasks", "4", "python", "x.py"]
    assert srun.srun_command(None, ["a"], "pmix") == ["srun", "--mpi=pmix", "a"]


def test_requeue_refuses_outside_slurm_and_reports_a_failed_scontrol(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(SlurmError, match="SLURM_JOB_ID is not set"):
        requeue.requeue()
    failing = tmp_path / "scontrol"
    failing.write_text("#!/bin/sh\necho \"Invalid job id specified\" >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(SlurmError, match=r"scontrol requeue 99 failed \(1\): Invalid job id"):
        requeue.requeue("99", scontrol=str(failing))
    with pytest.raises(SlurmError, match="was not found"):
        requeue.requeue("99", scontrol=str(tmp_path / "missing"))
    assert issubclass(SlurmOptionError, SlurmError) and issubclass(SlurmError, HpcrepError)
