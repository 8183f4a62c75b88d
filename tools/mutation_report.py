"""Summarise a mutmut run (``make mutation``): the share of mutants killed per module and the
survivors with their diffs.

Reads mutmut's per-file results (``mutants/<path>.meta``, written by ``mutmut run`` in the
repository's root), prints a summary table and writes ``reports/mutation-<time>/report.md``: per
module the killed / survived / timeout / no-tests / other counts, the kill rate, and every mutant
that was not killed with its diff (what ``mutmut show NAME`` prints).

Kill rate = (killed + timeout) / mutants checked. A mutant no selected test runs ("no tests")
counts as checked and not killed: it is a gap too. Mutants a run did not reach (it was stopped
at its time limit) are counted as "not checked" and left out of the rate. Run from the
repository's root, after ``mutmut run``::

    python tools/mutation_report.py [--elapsed SECONDS] [--out reports/mutation-<time>]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MUTANTS = Path("mutants")
# mutmut 3.8's exit codes (mutmut/stats.py, status_by_exit_code); anything else is "suspicious".
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", 37: "type check", -24: "timeout", 24: "timeout",
          152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault", 2: "interrupted",
          None: "not checked"}
COLUMNS = ("killed", "timeout", "survived", "no tests", "other", "not checked")


def status_of(exit_code: Any) -> str:
    """Return mutmut's name for a mutant's exit code, folded into :data:`COLUMNS`."""
    status = STATUS.get(exit_code, "suspicious")
    return status if status in COLUMNS else "other"


def load(mutants: Path = MUTANTS) -> dict[str, dict[str, Any]]:
    """Return ``{source path: {mutant name: exit code}}`` for every file mutmut mutated."""
    results: dict[str, dict[str, Any]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        if codes:
            results[str(meta.relative_to(mutants))[:-len(".meta")]] = codes
    return results


def summarise(codes: dict[str, Any]) -> dict[str, Any]:
    """Return the counts per status column, the total and the kill rate of one module."""
    counts = {c: 0 for c in COLUMNS}
    for code in codes.values():
        counts[status_of(code)] += 1
    checked = len(codes) - counts["not checked"]
    counts["total"] = len(codes)
    counts["rate"] = (counts["killed"] + counts["timeout"]) / checked if checked else None
    return counts


def diff_of(name: str) -> str:
    """Return the diff of mutant ``name`` against the original function (``mutmut show``)."""
    try:
        from mutmut.mutation.diff_apply import get_diff_for_mutant  # noqa: PLC0415
        return get_diff_for_mutant(name)
    except Exception:  # noqa: BLE001 - mutmut's internals moved: ask its command line instead
        out = subprocess.run([sys.executable, "-m", "mutmut", "show", name],
                             capture_output=True, text=True, check=False)
        return (out.stdout or out.stderr).strip()


def table(rows: dict[str, dict[str, Any]]) -> str:
    """Return the summary as a Markdown table, one row per module and a total."""
    head = ("module",) + COLUMNS + ("total", "kill rate")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for module, c in rows.items():
        rate = "-" if c["rate"] is None else f"{c['rate']:.0%}"
        cells = [module] + [str(c[k]) for k in COLUMNS] + [str(c["total"]), rate]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elapsed", type=float, help="seconds the mutmut run took")
    parser.add_argument("--out", type=Path, help="report folder (default reports/mutation-<time>)")
    args = parser.parse_args(argv)

    results = load()
    if not results:
        print("mutation_report: no results in mutants/: run `mutmut run` (make mutation) first",
              file=sys.stderr)
        return 1
    rows = {path: summarise(codes) for path, codes in results.items()}
    everything = {k: v for codes in results.values() for k, v in codes.items()}
    rows_total = dict(rows, TOTAL=summarise(everything))

    when = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or Path("reports") / f"mutation-{when:%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    text = [f"# Mutation testing ({when:%Y-%m-%d %H:%M} UTC)", ""]
    if args.elapsed is not None:
        text += [f"mutmut run took {args.elapsed:.0f} s.", ""]
    text += ["Kill rate = (killed + timeout) / mutants checked; 'no tests': no selected test "
             "calls the mutated function; 'not checked': the run stopped before this mutant.",
             "", table(rows_total), ""]
    for path, codes in results.items():
        left = sorted((k for k, v in codes.items()
                       if status_of(v) not in ("killed", "timeout", "not checked")), key=_natural)
        text += [f"## {path}: {len(left)} not killed", ""]
        for name in left:
            text += [f"### {name} ({status_of(codes[name])})", "", "```diff", diff_of(name), "```",
                     ""]
    (out / "report.md").write_text("\n".join(text))

    print(table(rows_total))
    if args.elapsed is not None:
        print(f"mutmut run took {args.elapsed:.0f} s")
    print(f"report: {out / 'report.md'}")
    return 0


def _natural(name: str) -> tuple[str, int]:
    """Sort ``f__mutmut_10`` after ``f__mutmut_9``."""
    stem, _, number = name.rpartition("_")
    return (stem, int(number)) if number.isdigit() else (name, 0)


if __name__ == "__main__":
    sys.exit(main())
