"""``hpcrep bench``/``hpcrep report`` reach the source checkout's bench/ and jobs/ without
importing them: found next to the hpcrep package (or in the current directory), run as
``python -m bench`` in a child process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hpcrep.cli import main
from hpcrep.launch.checkout import find_checkout

REPO = Path(__file__).resolve().parents[2]


def test_the_checkout_is_found_beside_the_package_from_any_directory(tmp_path):
    assert find_checkout(str(tmp_path)) == str(REPO)


def test_bench_arguments_reach_the_checkouts_benchmark_unparsed(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--help"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: hpcrep bench") and "--ranks" in out and "--no-mwms" in out
    assert main(["bench", "--ranks", "1,2"]) == 2  # the model is missing: bench's parser says so
    assert "the following arguments are required: model" in capfd.readouterr().err


def test_without_a_checkout_the_commands_say_where_to_run_from(tmp_path):
    # An installed hpcrep (no bench/ or jobs/ beside it), run from a directory without them.
    site = tmp_path / "site"
    shutil.copytree(REPO / "hpcrep", site / "hpcrep",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-m", "hpcrep.cli", "bench", "all"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs the hpcrep source checkout" in proc.stderr and str(work) in proc.stderr
    # ... and from the top of a checkout it finds that one.
    checkout = tmp_path / "checkout"
    for part in ("bench", "jobs"):
        (checkout / part).mkdir(parents=True)
        (checkout / part / "__init__.py").write_text("")
    proc = subprocess.run([sys.executable, "-c", "import hpcrep.launch.checkout as c; "
                           "print(c.hpcrep.__file__); print(c.find_checkout())"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    package, found = proc.stdout.split()
    assert package.startswith(str(site)) and found == str(checkout), proc.stderr


def test_a_bench_package_in_the_working_directory_is_not_run(capfd, tmp_path, monkeypatch):
    """Run from a directory of the user's that has a ``bench`` package of its own (a project's
    benchmarks, say): the checkout's benchmark runs, never that one."""
    for part in ("bench", "jobs"):
        (tmp_path / part).mkdir()
        (tmp_path / part / "__init__.py").write_text("")
    (tmp_path / "bench" / "__main__.py").write_text("print('the wrong bench ran')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--help"]) == 0
    out = capfd.readouterr().out
    assert "the wrong bench ran" not in out and out.startswith("usage: hpcrep bench"), out
