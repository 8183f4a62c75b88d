"""``python -m bench MODEL [options]``: the scaling benchmark (``hpcrep bench`` runs this);
``python -m bench report DIR [--rederive]``: re-render a report (``hpcrep report``);
``python -m bench convergence [EXPERIMENT] [options]``: the paper's convergence results at small
scale (``bench/convergence.py``).

Run it from the repository's top directory (or with that directory on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` with ``bench.command`` (or ``bench.report_command`` after ``report``,
    ``bench.convergence`` after ``convergence``) and run it; return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name, prog = "bench.command", "hpcrep bench"
    if argv[:1] == ["report"]:
        name, prog, argv = "bench.report_command", "hpcrep report", argv[1:]
    elif argv[:1] == ["convergence"]:
        name, prog, argv = "bench.convergence", "hpcrep bench convergence", argv[1:]
    module = importlib.import_module(name)
    parser = argparse.ArgumentParser(prog=prog, description=module.__doc__.splitlines()[0])
    module.configure(parser)
    return int(module.main(parser.parse_args(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
