"""``hpcrep report DIR``: re-render ``DIR/report.md`` and the plots from ``DIR/report.json``."""

from __future__ import annotations

import argparse
import json
import os


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``hpcrep report``."""
    parser.add_argument("dir", help="a report directory written by `hpcrep bench`")
    parser.add_argument("--rederive", action="store_true",
                        help="recompute efficiencies, ratios and the projection first")
    parser.add_argument("--against", metavar="EARLIER_DIR", default=None,
                        help="also check every summary ratio against an earlier report's range "
                             "(bench/reproduce.py)")


def main(args: argparse.Namespace) -> int:
    """Re-render the report; returns 0, or 2 if DIR holds no report.json."""
    from bench import report, report_markdown  # noqa: PLC0415

    path = os.path.join(args.dir, "report.json")
    if not os.path.exists(path):
        print(f"hpcrep report: {path} does not exist; give a directory written by `hpcrep bench`")
        return 2
    with open(path) as f:
        data = json.load(f)
    if args.rederive or report.derived_by_older_version(data):
        report.derive(data)
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
    paths = report_markdown.render(data, args.dir)
    print(report.summary(data))
    print("wrote " + ", ".join(paths))
    if args.against:
        from bench import reproduce  # noqa: PLC0415

        earlier = os.path.join(args.against, "report.json")
        if not os.path.exists(earlier):
            print(f"hpcrep report: {earlier} does not exist; --against takes a directory "
                  "written by `hpcrep bench`")
            return 2
        with open(earlier) as f:
            print(reproduce.table(json.load(f), data))
    return 0
