"""Run Horovod's own TensorFlow test suite against hpcrep, as Horovod's CI runs it (2 ranks).

    python tools/horovod_suite.py --horovod-src DIR [--mode graph|eager|both] [-n 2] [-k EXPR]

``DIR`` is a Horovod source tree: a checkout, or a bare git repository (its ``HEAD`` is read).
Nothing of Horovod's is copied into this repository: its ``test/parallel/test_tensorflow.py`` and
``base_test_tensorflow.py`` are written to a temporary directory, next to a ``conftest.py`` that
maps ``horovod.tensorflow`` to ``hpcrep.tensorflow`` by name only (hpcrep's own
:mod:`hpcrep.tensorflow.horovod_alias`, as ``hpcrep run`` uses), stands in for Horovod's
``test/utils/common.py`` (rank and size from the launcher's environment; GPU tests skip) and picks
the mode: Horovod decorates the class with ``run_all_in_graph_and_eager_modes`` (every test runs
as a TF1 graph in a session, then eagerly); ``--mode graph`` or ``eager`` runs one half only, so
the two are counted apart. Every rank writes a JUnit file; a test passes when it passed on every
rank. The summary (counts, then each failing test with its first error line) is printed and
written to ``--out`` as JSON. Not part of ``make test``: it needs Horovod's sources, which CI
does not fetch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILES = ("test/parallel/test_tensorflow.py", "test/parallel/base_test_tensorflow.py")

CONFTEST = '''
"""Written by hpcrep's tools/horovod_suite.py: horovod -> hpcrep by name, the mode, common.py."""
import functools
import os
import sys
import types

from tensorflow.python.framework import ops, test_util

from hpcrep.tensorflow.horovod_alias import horovod_alias

# horovod.tensorflow[.X] -> hpcrep.tensorflow[.X], as `hpcrep run` maps it, for the whole run
# (the context is kept referenced: a collected one would remove the alias).
_ALIAS = horovod_alias()
_ALIAS.__enter__()

_common = types.ModuleType("common")


def mpi_env_rank_and_size():
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                       ("PMIX_RANK", "PMIX_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ.get(size, 1))
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    test.skipTest(message)


_common.mpi_env_rank_and_size = mpi_env_rank_and_size
_common.skip_or_fail_gpu_test = skip_or_fail_gpu_test
sys.modules["common"] = _common

_MODE = os.environ["HPCREP_HOROVOD_SUITE_MODE"]


def _graph_half(f):
    """The graph half of run_in_graph_and_eager_modes: a fresh graph and the test's session."""
    @functools.wraps(f)
    def run(self, *args, **kwargs):
        with ops.Graph().as_default(), self.test_session():
            f(self, *args, **kwargs)
    return run


if _MODE != "both":
    def _one_mode(cls):
        import unittest
        for name in dir(cls):
            if not name.startswith(unittest.TestLoader.testMethodPrefix) or name == "test_session":
                continue
            value = getattr(cls, name, None)
            if callable(value) and _MODE == "graph":
                setattr(cls, name, _graph_half(value))
        return cls
    test_util.run_all_in_graph_and_eager_modes = _one_mode
'''


def read_sources(src: Path, into: Path) -> None:
    """Write Horovod's test files from ``src`` (a checkout or a bare git repository) to ``into``."""
    for name in FILES:
        target = into / Path(name).name
        if (src / name).is_file():
            target.write_text((src / name).read_text())
            continue
        shown = subprocess.run(["git", "--git-dir", str(src), "show", f"HEAD:{name}"],
                               capture_output=True, text=True)
        if shown.returncode != 0:
            sys.exit(f"horovod_suite: {src} has no {name} (a Horovod checkout or bare repository "
                     f"is needed): {shown.stderr.strip()}")
        target.write_text(shown.stdout)


def first_error(message: str, text: str) -> str:
    """Return the most telling line of a failure: hpcrep's or the exception's own message."""
    lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    raised = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception|Failure)\b:? ", ln)]
    best = (raised or lines or message.splitlines() or [""])[-1 if raised else 0]
    return best[:240]


def outcomes(junit_files: list[Path]) -> dict[str, dict]:
    """Return {test: {"outcome": passed|failed|skipped, "message": str}} over every rank's file."""
    merged: dict[str, dict] = {}
    rank_order = {"failed": 2, "passed": 0, "skipped": 1}
    for path in junit_files:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("name")
            outcome, message = "passed", ""
            for tag, label in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
                node = case.find(tag)
                if node is not None:
                    outcome = label
                    message = first_error(node.get("message") or "", node.text or "")
                    break
            seen = merged.get(name)
            if seen is None or rank_order[outcome] > rank_order[seen["outcome"]]:
                merged[name] = {"outcome": outcome, "message": message}
    return merged


def main(argv=None) -> int:
    """Run the suite in the chosen mode(s) and print and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-src", type=Path, required=True,
                        help="a Horovod checkout or bare git repository")
    parser.add_argument("--mode", choices=("graph", "eager", "both"), default="both",
                        help="both: each mode counted apart (two runs)")
    parser.add_argument("-n", type=int, default=2, help="ranks (Horovod's CI uses 2)")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--out", type=Path, default=None, help="JSON summary (default: none)")
    args = parser.parse_args(argv)
    modes = ("graph", "eager") if args.mode == "both" else (args.mode,)
    summary = {}
    with tempfile.TemporaryDirectory(prefix="horovod-suite-") as tmp:
        tmp = Path(tmp)
        read_sources(args.horovod_src, tmp)
        (tmp / "conftest.py").write_text(CONFTEST)
        for mode in modes:
            junit = tmp / f"junit-{mode}"
            junit.mkdir()
            env = dict(os.environ, HPCREP_HOROVOD_SUITE_MODE=mode, PYTHONPATH=str(REPO),
                       HPCREP_THREADS=os.environ.get("HPCREP_THREADS", "1"))
            rank_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        f"--timeout={args.timeout}", "-o", "junit_family=xunit1",
                        str(tmp / "test_tensorflow.py")]
            if args.k:
                rank_cmd += ["-k", args.k]
            # Each rank writes its own JUnit file: the rank number comes from the environment.
            wrapper = ("import os, sys, pytest; "
                       "r = next((os.environ[k] for k in ('OMPI_COMM_WORLD_RANK', 'PMI_RANK', "
                       "'PMIX_RANK') if k in os.environ), '0'); "
                       "sys.exit(pytest.main(sys.argv[1:] + "
                       f"['--junitxml={junit}/rank' + r + '.xml']))")
            cmd = [sys.executable, "-m", "hpcrep.launch.mpirun", "-n", str(args.n), "--",
                   sys.executable, "-c", wrapper, *rank_cmd[3:]]
            print(f"horovod_suite: {mode} mode: {' '.join(cmd)}", flush=True)
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
            files = sorted(junit.glob("rank*.xml"))
            if not files:
                print(proc.stdout[-4000:], proc.stderr[-4000:])
                sys.exit(f"horovod_suite: {mode} mode wrote no results (exit {proc.returncode})")
            summary[mode] = outcomes(files)
    for mode, results in summary.items():
        counts = {k: sum(1 for r in results.values() if r["outcome"] == k)
                  for k in ("passed", "failed", "skipped")}
        print(f"\n{mode}: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped ({len(results)} tests, {args.n} ranks)")
        for name, r in sorted(results.items()):
            if r["outcome"] == "failed":
                print(f"  FAILED {name}: {r['message']}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
