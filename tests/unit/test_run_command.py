"""``hpcrep run``'s command line (hpcrep.launch.run_command, hosts, script_api): horovodrun's
options mapped to this MPI's syntax, slots checked, the mode read from the script, extra MPI
arguments passed through, options of features not built yet refused (or passed to every rank
once their setting exists), and the ``horovod`` import alias of explicit scripts."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from hpcrep import cli, config
from hpcrep.errors import LaunchOptionError
from hpcrep.launch import run_command
from hpcrep.launch.hosts import Host, check_ranks, parse_hostfile, parse_hosts
from hpcrep.launch.script_api import explicit_imports

OPEN_MPI_4 = "mpirun (Open MPI) 4.1.4\n"
MPICH_4 = "HYDRA build details:\n    Version:                                 4.1.2\n"
ROOT_FLAGS = ["--allow-run-as-root"] if os.geteuid() == 0 else []


def fake_mpirun(directory, text: str) -> str:
    """An executable that prints ``text`` for ``--version``, as an mpirun would."""
    path = directory / f"mpirun-{abs(hash(text))}"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def scripts(tmp_path):
    """An unchanged Keras script and an explicit one (hpcrep.tensorflow), as files."""
    plain = tmp_path / "plain.py"
    plain.write_text("import keras\nimport hpcrep.comm\nprint(keras.__version__)\n")
    explicit = tmp_path / "explicit.py"
    explicit.write_text("import keras\n\n\ndef main():\n    import hpcrep.tensorflow as hvd\n"
                        "    hvd.init()\n")
    return str(plain), str(explicit)


def launch(tmp_path, argv, text=OPEN_MPI_4, environ=None):
    return run_command.build_launch(run_command.parse(argv), environ=environ or {},
                                    mpirun=fake_mpirun(tmp_path, text))


def test_host_lists_as_horovodrun_takes_them():
    assert parse_hosts("node1:2,node2:2") == [Host("node1", 2), Host("node2", 2)]
    assert parse_hosts("a, b:3") == [Host("a", 1), Host("b", 3)]  # a host alone: 1 slot
    for bad, why in [("a:0", "at least 1"), ("a:x", "at least 1"), ("a,,b", "empty host"),
                     ("", "empty host"), ("a b:2", "not a host name")]:
        with pytest.raises(LaunchOptionError, match=why):
            parse_hosts(bad)


def test_hostfiles_of_horovodrun_open_mpi_and_mpich():
    text = ("# the cluster\nnode1 slots=4\n\nnode2 slots=2 max_slots=8   # Open MPI\n"
            "node3:3\nnode4\n")
    assert parse_hostfile(text) == [Host("node1", 4), Host("node2", 2), Host("node3", 3),
                                    Host("node4", 1)]
    with pytest.raises(LaunchOptionError, match="hosts.txt line 2: 'node2 4'"):
        parse_hostfile("node1 slots=1\nnode2 4\n", "hosts.txt")
    with pytest.raises(LaunchOptionError, match="line 1: host 'node1' has slots '-1'"):
        parse_hostfile("node1 slots=-1\n")
    with pytest.raises(LaunchOptionError, match="no hosts"):
        parse_hostfile("# nothing\n\n")


def test_more_ranks_than_slots_is_an_error_naming_both():
    hosts = parse_hosts("a:2,b:2")
    assert check_ranks(None, hosts, "-H a:2,b:2") == 4
    assert check_ranks(3, hosts, "-H a:2,b:2") == 3
    with pytest.raises(LaunchOptionError, match=r"-np 5 .* the 4 slots of -H a:2,b:2"):
        check_ranks(5, hosts, "-H a:2,b:2")


@pytest.mark.parametrize("source, modules", [
    ("import hpcrep.tensorflow as hvd\n", ["hpcrep.tensorflow"]),
    ("from hpcrep import tensorflow as hvd\n", ["hpcrep.tensorflow"]),
    ("import hpcrep.tensorflow.keras as hvd\n", ["hpcrep.tensorflow.keras"]),
    ("from hpcrep.keras import callbacks\n", ["hpcrep.keras"]),
    ("import horovod.tensorflow.keras as hvd\n", ["horovod.tensorflow.keras"]),
    ("def f():\n    if True:\n        from horovod.keras import callbacks\n", ["horovod.keras"]),
    ("import importlib\nhvd = importlib.import_module('horovod.tensorflow')\n",
     ["horovod.tensorflow"]),
    ("import keras\nimport hpcrep.comm as hc\nimport hpcrep.data\n", []),
    ("import horovodx\nimport hpcrep_tensorflow\n", []),
])
def test_explicit_imports_are_found_anywhere_in_the_script(source, modules):
    assert [f.module for f in explicit_imports(source)] == modules


def test_a_script_that_does_not_parse_says_how_to_choose():
    with pytest.raises(LaunchOptionError, match=r"line 1: .*--transparent / --no-transparent"):
        explicit_imports("def (:\n", "train.py")


def test_open_mpi_argv_with_hosts_and_the_mode_read_from_the_script(tmp_path, scripts):
    plain, explicit = scripts
    got = launch(tmp_path, ["-np", "4", "-H", "node1:2,node2:2", explicit, "--epochs", "2"])
    assert got.argv[1:] == ["-n", "4", "--oversubscribe", "--bind-to", "none", *ROOT_FLAGS,
                            "--host", "node1:2,node2:2", sys.executable, "-m", "hpcrep",
                            "--no-transparent", explicit, "--epochs", "2"]
    assert not got.transparent and [(f.module, f.line) for f in got.found] == [
        ("hpcrep.tensorflow", 5)]
    got = launch(tmp_path, ["-H", "node1:2,node2:1", plain])  # -np: all slots
    assert got.transparent and got.argv[1:3] == ["-n", "3"]
    assert got.argv[-4:] == [sys.executable, "-m", "hpcrep", plain]


def test_transparent_flags_override_the_script(tmp_path, scripts):
    plain, explicit = scripts
    assert launch(tmp_path, ["-n", "2", "--transparent", explicit]).argv[-4:] == [
        sys.executable, "-m", "hpcrep", explicit]
    assert launch(tmp_path, ["-n", "2", "--no-transparent", plain]).argv[-2:] == [
        "--no-transparent", plain]
    with pytest.raises(LaunchOptionError, match="no script"):
        launch(tmp_path, ["-n", "2", str(tmp_path / "missing.py")])
    assert launch(tmp_path, ["-n", "2", "--transparent", str(tmp_path / "missing.py")]).transparent


def test_mpich_hosts_hostfile_and_mpi_args_pass_through(tmp_path, scripts):
    plain, _ = scripts
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    got = launch(tmp_path, ["-np", "4", "--hostfile", str(hostfile), "--mpi-args",
                            "-genv FOO 'a b' -bind-to core", plain], text=MPICH_4)
    assert got.argv[1:] == ["-n", "4", "-hosts", "node1:2,node2:2", "-genv", "FOO", "a b",
                            "-bind-to", "core", sys.executable, "-m", "hpcrep", plain]
    with pytest.raises(LaunchOptionError, match=r"-np 5 .* 4 slots of --hostfile"):
        launch(tmp_path, ["-np", "5", "--hostfile", str(hostfile), plain])
    with pytest.raises(LaunchOptionError, match="cannot read it"):
        launch(tmp_path, ["--hostfile", str(tmp_path / "none.txt"), plain])
    with pytest.raises(SystemExit):  # -H and --hostfile together: argparse refuses
        run_command.parse(["-H", "a:1", "--hostfile", str(hostfile), plain])


def test_hosts_get_every_hpcrep_setting_of_this_environment(tmp_path, scripts):
    plain, _ = scripts
    environ = {"HPCREP_STALL_TIMEOUT": "20", "HPCREP_FUSION_THRESHOLD": "1MiB",
               "HPCREP_TIMELINE": "mine.json", "PATH": "/bin"}
    argv = ["-np", "2", "-H", "node1,node2", "--timeline-filename", "t.json", plain]
    got = launch(tmp_path, argv, environ=environ)
    # Open MPI forwards nothing else to other hosts: each name once, the option's value wins
    assert got.argv[got.argv.index("-x"):got.argv.index(sys.executable)] == [
        "-x", "HPCREP_FUSION_THRESHOLD", "-x", "HPCREP_STALL_TIMEOUT", "--host",
        "node1:1,node2:1", "-x", "HPCREP_TIMELINE=t.json"]
    # one host (no -H): the ranks inherit this environment; MPICH's Hydra passes all of it
    assert "-x" not in launch(tmp_path, ["-np", "2", plain], environ=environ).argv
    mpich = launch(tmp_path, ["-np", "2", "-H", "node1,node2", plain], text=MPICH_4,
                   environ=environ).argv
    assert mpich[mpich.index("-hosts"):mpich.index(sys.executable)] == ["-hosts",
                                                                         "node1:1,node2:1"]


def test_bad_settings_exit_2_before_anything_is_launched(tmp_path, scripts, monkeypatch,
                                                         capsys):
    plain, _ = scripts
    monkeypatch.setenv("HPCREP_STALL_TIMEOUT", "-5")
    monkeypatch.setenv("HPCREP_FUSION_TRESHOLD", "1MiB")
    monkeypatch.setattr(run_command, "build_launch", lambda *a, **k: pytest.fail("launched"))
    assert run_command.main(run_command.parse(["-np", "2", "--dry-run", plain])) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 2, err
    assert err.startswith("hpcrep: HPCREP_FUSION_TRESHOLD is not an hpcrep setting (did you "
                          "mean HPCREP_FUSION_THRESHOLD?)"), err
    assert "hpcrep: HPCREP_STALL_TIMEOUT='-5' is out of range" in err


def test_horovodrun_python_word_picks_the_ranks_python(tmp_path, scripts):
    plain, _ = scripts
    got = launch(tmp_path, ["-np", "2", "python3", plain, "--x"])
    assert got.argv[-5:] == ["python3", "-m", "hpcrep", plain, "--x"]
    with pytest.raises(LaunchOptionError, match="right after python"):
        launch(tmp_path, ["-np", "2", "python", "-u", plain])


def test_feature_options_reach_every_rank_as_their_settings(tmp_path, scripts):
    plain, _ = scripts
    assert all(setting in config.SETTINGS for _, _, setting in run_command.OPTION_SETTINGS)
    argv = ["-np", "2", "--timeline-filename", "t.json", "--autotune", plain]
    got = launch(tmp_path, argv)
    first = got.argv.index("-x")
    assert got.argv[first:first + 5] == [
        "-x", "HPCREP_TIMELINE=t.json", "-x", "HPCREP_AUTOTUNE=1", sys.executable]
    assert "-genv" in launch(tmp_path, argv, text=MPICH_4).argv
    inside = launch(tmp_path, argv, environ={"SLURM_JOB_ID": "7"})  # srun passes the env on
    assert inside.env == {"HPCREP_TIMELINE": "t.json", "HPCREP_AUTOTUNE": "1"}


def test_max_np_is_an_elastic_option_of_at_least_np(tmp_path, scripts):
    plain, _ = scripts
    with pytest.raises(LaunchOptionError, match="--max-np applies to --elastic"):
        launch(tmp_path, ["-np", "2", "--max-np", "4", plain])
    for bad in (["--max-np", "1"], ["--min-np", "2", "--max-np", "1"]):
        with pytest.raises(LaunchOptionError, match="give at least -np"):
            launch(tmp_path, ["-np", "2", "--elastic", *bad, plain])
    got = launch(tmp_path, ["-np", "2", "--elastic", "--max-np", "4", plain])
    assert "HPCREP_ELASTIC_MAX_NP=4" in got.argv


def test_batches_per_commit_is_an_elastic_option_of_one_or_more(tmp_path, scripts):
    plain, _ = scripts
    with pytest.raises(LaunchOptionError, match="--batches-per-commit applies to --elastic"):
        launch(tmp_path, ["-np", "2", "--batches-per-commit", "4", plain])
    with pytest.raises(LaunchOptionError, match="give 1 or more batches"):
        launch(tmp_path, ["-np", "2", "--elastic", "--batches-per-commit", "0", plain])
    got = launch(tmp_path, ["-np", "2", "--elastic", "--batches-per-commit", "4", plain])
    assert "HPCREP_ELASTIC_BATCHES_PER_COMMIT=4" in got.argv


def test_slurm_allocation_uses_srun_and_refuses_hosts(tmp_path, scripts):
    plain, explicit = scripts
    slurm = {"SLURM_JOB_ID": "7"}
    got = launch(tmp_path, ["--mpi-args=--cpu-bind=none", explicit], environ=slurm)
    assert got.argv == ["srun", "--mpi=pmix", "--cpu-bind=none", sys.executable, "-m", "hpcrep",
                        "--no-transparent", explicit]
    assert launch(tmp_path, ["-n", "2", plain], MPICH_4, slurm).argv[:4] == [
        "srun", "--mpi=pmi2", "--ntasks", "2"]
    for where in (["-H", "node1:2"], ["--hostfile", "h.txt"]):
        with pytest.raises(LaunchOptionError, match=f"{where[0]} cannot be used with srun"):
            launch(tmp_path, [*where, plain], environ=slurm)
    mpirun = launch(tmp_path, ["--launcher", "mpirun", "-H", "node1:2", plain], environ=slurm)
    assert "--host" in mpirun.argv and mpirun.argv[1:3] == ["-n", "2"]
    with pytest.raises(LaunchOptionError, match="number of ranks"):
        launch(tmp_path, [plain])
    with pytest.raises(LaunchOptionError, match="at least 1"):
        launch(tmp_path, ["-np", "0", plain])


def test_help_shows_examples_and_the_horovodrun_mapping(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "examples:\n  hpcrep run -np 4 train.py" in text  # raw: the layout is kept
    assert "hpcrep run -np 4 -H node1:2,node2:2 train.py" in text
    assert "horovodrun -> hpcrep run" in text and "--hostfile" in text


def test_verbose_dry_run_prints_the_mode_and_the_command(tmp_path, scripts, capsys):
    _, explicit = scripts
    assert run_command.main(run_command.parse(["-np", "2", "--verbose", "--dry-run",
                                               explicit])) == 0
    out, err = capsys.readouterr()
    assert f"hpcrep run: {explicit} imports hpcrep.tensorflow (line 5): explicit API" in err
    assert f"-m hpcrep --no-transparent {explicit}" in out and "mpirun -n 2" in out


def test_horovod_alias_maps_horovod_to_hpcrep_and_goes_away(capsys):
    from hpcrep.tensorflow import horovod_alias

    assert not horovod_alias.horovod_installed()
    with horovod_alias.horovod_alias() as mapped:
        assert mapped
        import horovod.keras.callbacks
        import horovod.tensorflow.keras as hvd
        import hpcrep.tensorflow.keras
        import hpcrep.tensorflow.keras.callbacks

        assert hvd is hpcrep.tensorflow.keras and hvd.DistributedOptimizer
        assert horovod.keras.callbacks is hpcrep.tensorflow.keras.callbacks
        assert hpcrep.tensorflow.keras.__spec__.name == "hpcrep.tensorflow.keras"  # untouched
        with pytest.raises(ModuleNotFoundError, match="answers only for horovod.tensorflow"):
            import horovod.torch
    assert capsys.readouterr().err.count("Horovod is not installed here") == 1
    assert not any(n == "horovod" or n.startswith("horovod.") for n in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import horovod
