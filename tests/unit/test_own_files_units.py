"""One-process tests of the script's own files under ``python -m hpcrep``
(:mod:`hpcrep.tensorflow.transparent.own_files`), acting as rank 1, and of what decides whether a
script gets them (its file, and whether it knows its rank)."""

from __future__ import annotations

import builtins
import io
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hpcrep.launch.runner import script_file
from hpcrep.launch.script_api import knows_rank
from hpcrep.tensorflow.transparent import own_files
from hpcrep.tensorflow.transparent.patching import PatchSet

HPCREP_DIR = Path(own_files.__file__).resolve().parents[2]

# Code run as if it were in a given file: the script, a library, or one of hpcrep's modules.
LIBRARY = """
def call(f, *args):
    return f(*args)
"""


def on_disk(path) -> str:
    """What the file on disk holds (``io.FileIO`` is not patched: no shadow)."""
    with io.FileIO(path) as f:
        return f.read().decode()


def code_in(filename: str, source: str) -> dict:
    namespace: dict = {"__name__": "m"}
    exec(compile(textwrap.dedent(source), filename, "exec"), namespace)
    return namespace


@pytest.fixture
def files(tmp_path, monkeypatch):
    """rank 1's patches for a script ``train.py`` in ``tmp_path``; its code, a library's, and
    hpcrep's; restored at the end of the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    (tmp_path / "tmp").mkdir()
    script = str(tmp_path / "train.py")
    patches = PatchSet()
    own = own_files.install(patches, script, rank=1)
    library = code_in(str(tmp_path / "site-packages" / "lib.py"), LIBRARY)["call"]
    ns = code_in(script, """
        import os
        import numpy as np
        def write(path, text, mode="w"):
            with open(path, mode) as f:
                f.write(text)
        def read(path):
            with open(path) as f:
                return f.read()
        def through(call, *args):
            return call(*args)
        def makedirs(d):
            if not os.path.exists(d):
                os.makedirs(d)
        """)
    hpcrep_call = code_in(str(HPCREP_DIR / "fake_module.py"), LIBRARY)["call"]
    try:
        yield own, ns, library, hpcrep_call, tmp_path
    finally:
        patches.restore()


def test_the_scripts_writes_on_rank_1_go_to_its_shadow_and_read_back(files):
    own, ns, library, hpcrep_call, tmp = files
    (tmp / "out.txt").write_text("rank 0's")
    ns["write"]("out.txt", "rank 1's")
    assert on_disk(tmp / "out.txt") == "rank 0's"
    assert ns["read"]("out.txt") == "rank 1's"
    assert (tmp / "out.txt").read_text() == "rank 1's"  # any read on this rank sees the shadow
    ns["through"](library, np.save, "array.npy", np.arange(3))  # the script, through a library
    assert not (tmp / "array.npy").exists()
    np.testing.assert_array_equal(ns["through"](np.load, "array.npy"), np.arange(3))
    ns["write"]("log.txt", "a", "a")
    ns["write"]("log.txt", "b", "a")
    assert ns["read"]("log.txt") == "ab" and not (tmp / "log.txt").exists()


def test_writes_not_made_by_the_script_go_to_disk(files):
    own, ns, library, hpcrep_call, tmp = files
    ns["through"](hpcrep_call, builtins.open, "by_hpcrep.txt", "w").close()
    assert (tmp / "by_hpcrep.txt").exists()  # hpcrep between the script and open
    with open(tmp / "by_test.txt", "w") as f:  # no script frame at all
        f.write("x")
    assert (tmp / "by_test.txt").read_text() == "x"


def test_a_write_that_would_fail_in_one_process_fails(files):
    own, ns, *_ = files
    with pytest.raises(FileNotFoundError):
        ns["write"]("no/such/dir/out.txt", "x")
    with pytest.raises(FileNotFoundError):
        ns["write"]("missing.txt", "x", "r+")


def test_the_scripts_makedirs_and_mkdir_tolerate_an_existing_directory(files):
    own, ns, library, hpcrep_call, tmp = files
    (tmp / "ckpt").mkdir()
    os_in_script = ns["os"]
    ns["through"](os_in_script.makedirs, "ckpt")  # as if another rank made it first
    ns["through"](os_in_script.mkdir, "ckpt")
    ns["through"](Path("ckpt").mkdir)
    ns["makedirs"]("ckpt/new")
    assert (tmp / "ckpt" / "new").is_dir()
    (tmp / "a_file").write_text("")
    with pytest.raises(FileExistsError):
        ns["through"](os_in_script.makedirs, "a_file")
    with pytest.raises(FileExistsError):  # not the script's own call (mkdtemp, lock files)
        ns["through"](library, os_in_script.mkdir, "ckpt")
    with pytest.raises(FileExistsError):
        os.mkdir(tmp / "ckpt")


def test_restore_puts_every_original_back_and_removes_the_shadows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    originals = (builtins.open, io.open, os.mkdir, os.makedirs,
                 sys.modules["numpy.lib._datasource"].open)
    patches = PatchSet()
    own = own_files.install(patches, str(tmp_path / "train.py"), rank=1)
    assert builtins.open is not originals[0] and io.open is builtins.open
    write = code_in(str(tmp_path / "train.py"), "def write(p):\n    open(p, 'w').close()\n")
    write["write"]("x.txt")
    shadow = own.shadows.get(str(tmp_path / "x.txt"))
    assert shadow is not None and os.path.exists(shadow)
    patches.restore()
    assert (builtins.open, io.open, os.mkdir, os.makedirs,
            sys.modules["numpy.lib._datasource"].open) == originals
    assert not os.path.exists(os.path.dirname(shadow))
    write["write"]("x.txt")
    assert (tmp_path / "x.txt").exists()


def test_rank_0_keeps_open_and_only_tolerates_existing_directories(tmp_path):
    patches = PatchSet()
    original = builtins.open
    own_files.install(patches, str(tmp_path / "train.py"), rank=0)
    try:
        assert builtins.open is original
        (tmp_path / "ckpt").mkdir()  # another rank made it first
        code_in(str(tmp_path / "train.py"), f"import os\nos.makedirs({str(tmp_path / 'ckpt')!r})")
    finally:
        patches.restore()


@pytest.mark.parametrize("source,knows", [
    ("import keras\nmodel.fit(x, y)\n", False),
    ("from hpcrep.tensorflow.transparent import on_rank_zero\n", True),
    ("import hpcrep.comm as hc\n", True),
    ("from mpi4py import MPI\n", True),
    ("def f():\n    import horovod.tensorflow as hvd\n", True),
    ("import os\nrank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n", True),
    ("import os\nrank = os.environ.get('SLURM_PROCID', '0')\n", True),
    ("print('the rank of a matrix')\n", False),
    ("def (:\n", False),
])
def test_a_script_knows_its_rank_by_its_imports_and_rank_variables(source, knows):
    assert knows_rank(source) is knows


def test_the_script_file_is_found_for_paths_and_modules_without_importing(tmp_path,
                                                                          monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "pkg" / "train.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("")
    (tmp_path / "run.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert script_file(["run.py", "--epochs", "1"]) == "run.py"
    assert script_file(["-m", "pkg.train"]) == str(tmp_path / "pkg" / "train.py")
    assert script_file(["-m", "pkg"]) == str(tmp_path / "pkg" / "__main__.py")
    assert script_file(["missing.py"]) is None and script_file(["-m", "pkg.missing"]) is None
    assert script_file(["-m"]) is None and script_file([]) is None
