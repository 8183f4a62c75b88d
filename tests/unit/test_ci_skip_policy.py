"""Under CI=true a skip for a missing requirement fails; other skips stay skips."""

import subprocess
import sys
import textwrap
from pathlib import Path


def test_missing_requirement_fails_only_under_ci(tmp_path):
    (tmp_path / "conftest.py").write_text(
        (Path(__file__).parents[1] / "conftest.py").read_text())
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import pytest
        def test_needs_slurm(skip_missing):
            skip_missing("slurm (sbatch not on PATH)")
        def test_needs_two_ranks():
            pytest.skip("needs at least 2 ranks")
    """))

    def run(ci):
        env = {"PATH": "/usr/bin:/bin", "CI": ci}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(tmp_path)], capture_output=True, text=True, env=env)

    local = run("")
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout
    ci = run("true")
    assert ci.returncode == 1 and "1 failed, 1 skipped" in ci.stdout, ci.stdout
    assert "missing: slurm" in ci.stdout
