"""``hpcrep bench`` and ``hpcrep report``: run the benchmark of the hpcrep source checkout.

The benchmark harness (``bench/``) and the workloads it times (``jobs/``) sit at the top of the
repository, beside the ``hpcrep`` package, and are not installed with it: hpcrep never imports
them. These commands find the checkout and run ``python -P -m bench ARGS`` (``python -m bench
report ARGS`` for ``hpcrep report``) as a child process, with the checkout first on
``PYTHONPATH`` and the caller's working directory (where ``reports/`` goes). The checkout is the
directory above the ``hpcrep`` package that runs (a clone used in place, ``pip install -e``, or
``PYTHONPATH``), else the current directory; either must hold ``bench/`` and ``jobs/``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Optional, Sequence

import hpcrep
from hpcrep.launch.tf_log import set_tf_log_level


def configure(parser: argparse.ArgumentParser) -> None:
    """Describe the pass-through arguments (``hpcrep.cli`` forwards them unparsed)."""
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="arguments of the checkout's benchmark; --help lists them")


def find_checkout(cwd: Optional[str] = None) -> str:
    """Return the source checkout that holds ``bench/`` and ``jobs/``. Local.

    Raises:
        FileNotFoundError: neither the directory above the ``hpcrep`` package nor ``cwd``
            (default: the current directory) holds them; says where to run from.
    """
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(hpcrep.__file__)))
    candidates = [package_parent, os.path.abspath(cwd or os.getcwd())]
    for directory in candidates:
        if all(os.path.isfile(os.path.join(directory, part, "__init__.py"))
               for part in ("bench", "jobs")):
            return directory
    raise FileNotFoundError(
        "hpcrep bench needs the hpcrep source checkout (its bench/ and jobs/ folders are not "
        f"installed); looked in {' and '.join(candidates)}. Run it from the top of the "
        "checkout, or install hpcrep from it with pip install -e .")


def command(name: str, argv: Sequence[str]) -> list[str]:
    """Return the child's argv for ``hpcrep NAME ARGV``: ``python -P -m bench [report] ARGV``
    (``-P``: the working directory is not put first on the module path, so a ``bench`` package
    there cannot stand in for the checkout's)."""
    return [sys.executable, "-P", "-m", "bench", *(["report"] if name == "report" else []),
            *argv]


def forward(name: str, argv: Sequence[str]) -> int:
    """Run ``hpcrep NAME ARGV`` in the checkout's benchmark; return its exit code. Local."""
    try:
        checkout = find_checkout()
    except FileNotFoundError as exc:
        print(f"hpcrep {name}: {exc}", file=sys.stderr)
        return 2
    env = set_tf_log_level(dict(os.environ))  # HPCREP_TF_LOG, for the benchmark and its ranks
    env["PYTHONPATH"] = os.pathsep.join(
        [checkout] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.call(command(name, argv), env=env)


def main(args: argparse.Namespace) -> int:
    """Entry point through the parser (``hpcrep.cli`` normally calls :func:`forward` first)."""
    return forward(args.command, args.args)
