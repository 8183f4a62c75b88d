"""Slurm scripts: golden files for representative option sets, safe quoting, and invalid
options rejected before sbatch runs."""

import os
import shlex
import subprocess

import pytest

from hpcrep.cli import main as hpcrep_main
from hpcrep.errors import SlurmOptionError
from hpcrep.slurm import JobOptions, render

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "slurm")

CASES = {
    "minimal": JobOptions(command=("python", "train.py")),
    "multinode_gpu_requeue": JobOptions(
        command=("python", "train.py", "--note", "a b; rm -rf / $(id)"), job_name="resnet50",
        nodes=2, tasks_per_node=4, cpus_per_task=8, gpus_per_node=4, time="1-12:00:00",
        partition="gpu", account="proj.42", qos="normal", output="logs/run %j.out",
        error="logs/run-%j.err", modules=("gcc/12", "openmpi/4.1"),
        setup=("source $HOME/venv/bin/activate",), env=(("DATA", "/scratch/my data"),),
        signal_lead=120, requeue=True, checkpoint_dir="/scratch/ckpt's"),
    "mpirun_signal": JobOptions(command=("python", "-m", "hpcrep", "fit.py"), nodes=1,
                                tasks_per_node=4, time="30", launcher="mpirun", signal_lead=90,
                                requeue=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden(name):
    with open(os.path.join(GOLDEN, f"{name}.sh")) as f:
        assert render(CASES[name]) == f.read()


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_is_valid_bash(name):
    done = subprocess.run(["bash", "-n"], input=render(CASES[name]), text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr


def test_command_round_trips_through_the_shell():
    argv = ("python", "x.py", "a b", "; rm -rf /", "$(id)", "it's", "`x`", "*")
    script = render(JobOptions(command=argv))
    launch = script.strip().splitlines()[-1]
    assert shlex.split(launch)[-len(argv):] == list(argv)


@pytest.mark.parametrize("kwargs, match", [
    ({"nodes": 0}, "nodes: expected an integer >= 1; got 0"),
    ({"tasks_per_node": -1}, "tasks-per-node"),
    ({"time": "1:99"}, "invalid time"),
    ({"time": "0"}, "invalid time"),
    ({"time": "ten"}, "invalid time"),
    ({"partition": "a b"}, "partition"),
    ({"output": "x\ny"}, "output"),
    ({"launcher": "aprun"}, "launcher"),
    ({"signal_lead": 0}, "signal-lead"),
    ({"env": (("1BAD", "x"),)}, "env"),
    ({"command": ()}, "command"),
])
def test_invalid_options_are_rejected(kwargs, match):
    kwargs.setdefault("command", ("python", "x.py"))
    with pytest.raises(SlurmOptionError, match=match):
        JobOptions(**kwargs)


@pytest.mark.parametrize("time", ["30", "10:00", "1:30:00", "2-00", "2-00:00", "1-12:00:00"])
def test_valid_times(time):
    assert f"--time={time}" in render(JobOptions(command=("x",), time=time))


def test_cli_render_and_submit_rejects_before_sbatch(tmp_path, capsys):
    assert hpcrep_main(["slurm", "render", "--tasks-per-node", "4", "--env", "A=b c", "--",
                        "python", "t.py"]) == 0
    out = capsys.readouterr().out
    assert "export A='b c'" in out and "--ntasks=4" in out
    marker = tmp_path / "sbatch-ran"
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho 1\n")
    fake.chmod(0o755)
    assert hpcrep_main(["slurm", "submit", "--nodes", "0", "--sbatch", str(fake), "--",
                        "python", "t.py"]) == 2
    assert "invalid nodes" in capsys.readouterr().err and not marker.exists()
    assert hpcrep_main(["slurm", "submit", "--sbatch", str(fake), "--", "python", "t.py"]) == 0
    assert capsys.readouterr().out.strip() == "1" and marker.exists()


def test_gpu_pinning_by_local_rank():
    script = render(CASES["multinode_gpu_requeue"])
    pin = next(line for line in script.splitlines() if line.startswith("pin_gpu="))
    for local, gpu in (("0", "0"), ("5", "1"), ("3", "3")):
        run_pinned = "\n\"${pin_gpu[@]}\" sh -c 'echo $CUDA_VISIBLE_DEVICES'"
        done = subprocess.run(["bash", "-c", pin + run_pinned],
                              env={"PATH": os.environ["PATH"], "SLURM_LOCALID": local},
                              capture_output=True, text=True)
        assert done.stdout.strip() == gpu, done.stderr


# ----- sbatch's own spellings, quoting, the pass-through ------------------------------------

CLI_GOLDEN = {
    # The command, verbatim: sbatch's --ntasks-per-node and a job name with a space.
    "cli_sbatch_spellings": ["--nodes", "1", "--ntasks-per-node", "4", "--time", "00:05:00",
                             "--job-name", "a b", "--", "cmd"],
    "cli_every_option": ["-N", "2", "-n", "6", "-c", "3", "--gres", "gpu:a100:2", "-t", "2:00:00",
                         "-J", "run #3 of sweep", "-p", "gpu,debug", "-A", "proj", "-q", "high",
                         "-o", "logs/out %j.txt", "-e", "logs/err-%j.txt", "--mem", "16G",
                         "--exclusive", "-C", "a100&ib", "--signal", "B:USR1@120", "--requeue",
                         "--sbatch-option=--mail-type=END", "--sbatch-option", "-w node[1-2]",
                         "--sbatch-option", "comment=nightly run", "--", "python", "train.py"],
}


def cli_render(argv, capsys) -> str:
    assert hpcrep_main(["slurm", "render", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CLI_GOLDEN))
def test_cli_render_matches_golden(name, capsys):
    script = cli_render(CLI_GOLDEN[name], capsys)
    with open(os.path.join(GOLDEN, f"{name}.sh")) as f:
        assert script == f.read()
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("short, long", [
    (["-N", "2"], ["--nodes", "2"]), (["-n", "8"], ["--ntasks", "8"]),
    (["-c", "4"], ["--cpus-per-task", "4"]), (["-t", "30"], ["--time", "30"]),
    (["-J", "x"], ["--job-name", "x"]), (["-p", "gpu"], ["--partition", "gpu"]),
    (["-A", "acc"], ["--account", "acc"]), (["-q", "low"], ["--qos", "low"]),
    (["-o", "o.txt"], ["--output", "o.txt"]), (["-e", "e.txt"], ["--error", "e.txt"]),
    (["-C", "ib"], ["--constraint", "ib"]),
    (["--tasks-per-node", "4"], ["--ntasks-per-node", "4"]),  # hpcrep's older spelling
    (["--signal-lead", "90"], ["--signal", "USR1@90"]),
])
def test_short_and_old_spellings_render_the_same(short, long, capsys):
    assert cli_render([*short, "--", "x"], capsys) == cli_render([*long, "--", "x"], capsys)


def test_sbatch_reads_a_quoted_job_name_as_one_value():
    """What sbatch's #SBATCH parser does (quotes group, are dropped; '#' outside quotes starts
    a comment), applied to the rendered line: shlex in POSIX mode with comments behaves alike."""
    script = render(JobOptions(command=("x",), job_name="resnet run #2"))
    line = next(ln for ln in script.splitlines() if ln.startswith("#SBATCH --job-name"))
    assert shlex.split(line[len("#SBATCH "):], comments=True) == ["--job-name=resnet run #2"]


@pytest.mark.parametrize("argv, match", [
    (["--sbatch-option=--nodes=3"], "use hpcrep's --nodes instead"),
    (["--sbatch-option=-N 3"], "use hpcrep's --nodes instead"),
    (["--sbatch-option=--mail-type=END --mail-user=a@b"], "one option"),
    (["--sbatch-option=--comment=a\nb"], "sbatch-option"),
    (["--sbatch-option=--comment=say \"hi\""], "double quotes"),
    (["--sbatch-option", "=x"], "one sbatch option"),
    (["-J", "a\"b"], "invalid job-name"), (["-J", "a\\b"], "invalid job-name"),
    (["-J", "line\nbreak"], "invalid job-name"),
    (["--mem", "lots"], "invalid mem"), (["--gres", "gpu 4"], "invalid gres"),
    (["--signal", "USR1@soon"], "invalid signal"),
    (["--signal", "USR1@60", "--signal-lead", "60"], "not both"),
    (["-N", "2", "-n", "1"], "at least one task per node"),
    (["-N", "1", "-n", "5", "--ntasks-per-node", "4"], "at most"),
])
def test_cli_refuses_what_cannot_be_made_safe(argv, match, capsys):
    assert hpcrep_main(["slurm", "render", *argv, "--", "x"]) == 2
    assert match in capsys.readouterr().err


def test_gres_gpus_pin_ranks_like_gpus_per_node():
    script = render(JobOptions(command=("x",), tasks_per_node=4, gres="gpu:h100:4"))
    assert "% 4 ))" in script and '"${pin_gpu[@]}" x' in script


@pytest.mark.parametrize("argv, environ, warned", [
    (["--signal", "USR1@120", "--requeue"], {}, True),      # the README's example, bare
    (["--signal-lead", "90"], {}, True),
    (["--signal", "USR1@120", "--checkpoint-dir", "/scratch/c"], {}, False),
    (["--signal", "USR1@120", "--env", "HPCREP_CHECKPOINT_DIR=/scratch/c"], {}, False),
    (["--signal", "USR1@120"], {"HPCREP_CHECKPOINT_DIR": "/scratch/c"}, False),  # sbatch exports
    (["--signal", "USR2@120"], {}, False),                  # not hpcrep's checkpoint signal
    (["--requeue"], {}, False),
])
def test_render_warns_of_a_preemption_signal_with_nothing_to_save(argv, environ, warned,
                                                                  capsys, monkeypatch):
    """SIGUSR1's default action ends a process: without a checkpoint directory a transparent
    script dies of the pre-timeout signal (exit 138), so render says so on stderr, once, and
    still prints the same script on stdout."""
    monkeypatch.delenv("HPCREP_CHECKPOINT_DIR", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert hpcrep_main(["slurm", "render", *argv, "--", "python", "-m", "hpcrep", "t.py"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash")
    lines = [ln for ln in captured.err.splitlines() if "warning:" in ln]
    if warned:
        assert len(lines) == 1 and "without --checkpoint-dir" in lines[0], captured.err
        assert "exit 138" in lines[0] and "--checkpoint-dir DIR" in lines[0]
    else:
        assert not lines, captured.err
