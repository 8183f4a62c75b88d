"""``hpcrep analyze TRACE [--against TRACE2] [--png FILE]``: where a run's step time went.

Prints, per step and in total (averaged over ranks), the step time, compute, exposed
communication, MPI time and overlap fraction; bytes, MPI time and bandwidth per kind of
collective; and each rank's straggler score (see :mod:`hpcrep.analysis.trace` for the
definitions). ``--against`` prints a second trace's totals beside the first; ``--png`` draws
the figures (:mod:`hpcrep.analysis.plot`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from hpcrep.analysis.trace import Analysis, analyze, load


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``hpcrep analyze``'s arguments."""
    parser.description = ("Analyse a merged timeline (HPCREP_TIMELINE / hpcrep run "
                          "--timeline-filename): compute, exposed communication, overlap, "
                          "bandwidth and stragglers, per step and in total.")
    parser.add_argument("trace", help="the Chrome-trace JSON rank 0 wrote")
    parser.add_argument("--against", default=None, metavar="TRACE2",
                        help="a second trace, printed side by side")
    parser.add_argument("--png", default=None, metavar="FILE", help="also draw the figures")
    parser.add_argument("--max-steps", type=int, default=50,
                        help="print at most this many steps (default 50); totals cover all")


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fraction(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(result: Analysis, max_steps: int = 50) -> str:
    """Return the report of one trace as text."""
    lines = [f"ranks: {', '.join(result.ranks[r] for r in sorted(result.ranks))}", "",
             "step    step ms  compute ms  exposed comm ms  MPI ms  overlap   MB",
             "-" * 68]
    for n in result.step_numbers()[:max_steps]:
        m = result.mean_over_ranks(n)
        lines.append(f"{n:>4} {_ms(m['duration']):>10} {_ms(m['compute']):>11} "
                     f"{_ms(m['exposed']):>16} {_ms(m['mpi']):>7} {_fraction(m['overlap']):>8} "
                     f"{m['bytes'] / 1e6:>6.1f}")
    if len(result.step_numbers()) > max_steps:
        lines.append(f"... {len(result.step_numbers()) - max_steps} more steps")
    t = result.totals()
    lines += ["-" * 68,
              f"{'all':>4} {_ms(t['duration']):>10} {_ms(t['compute']):>11} "
              f"{_ms(t['exposed']):>16} {_ms(t['mpi']):>7} {_fraction(t['overlap']):>8} "
              f"{t['bytes'] / 1e6:>6.1f}", "",
              "collective        count        MB   MPI ms    GB/s"]
    for kind, row in sorted(result.per_kind.items()):
        lines.append(f"{kind:<16} {row['count']:>6} {row['bytes'] / 1e6:>9.1f} "
                     f"{row['mpi_ms']:>8.2f} {row['gbps']:>7.2f}")
    lines += ["", f"straggler score (ms later than the median rank at {result.matched} "
                  "collectives):"]
    for rank in sorted(result.straggler_ms):
        flag = "  <- latest" if rank == result.straggler() else ""
        lines.append(f"  {result.ranks.get(rank, rank)}: {result.straggler_ms[rank]:+.3f}{flag}")
    return "\n".join(lines)


def render_against(a: Analysis, b: Analysis, name_a: str, name_b: str) -> str:
    """Return two traces' totals side by side (per step: each total over its step count)."""
    ta, tb = a.totals(), b.totals()
    rows = [("steps", ta["steps"], tb["steps"], "{:.0f}"),
            ("step ms (mean)", _per(ta, "duration"), _per(tb, "duration"), "{:.2f}"),
            ("compute ms (mean)", _per(ta, "compute"), _per(tb, "compute"), "{:.2f}"),
            ("exposed comm ms (mean)", _per(ta, "exposed"), _per(tb, "exposed"), "{:.2f}"),
            ("MPI ms (mean)", _per(ta, "mpi"), _per(tb, "mpi"), "{:.2f}"),
            ("overlap fraction", ta["overlap"], tb["overlap"], "{:.2f}"),
            ("MB per step", _per(ta, "bytes", 1e6), _per(tb, "bytes", 1e6), "{:.1f}"),
            ("straggler rank", a.straggler(), b.straggler(), "{}")]
    width = max(len(name_a), len(name_b), 12)
    lines = [f"{'':<24} {name_a:>{width}} {name_b:>{width}}"]
    for label, x, y, fmt in rows:
        lines.append(f"{label:<24} {'-' if x is None else fmt.format(x):>{width}} "
                     f"{'-' if y is None else fmt.format(y):>{width}}")
    return "\n".join(lines)


def _per(totals: dict, key: str, scale: float = 1.0) -> Optional[float]:
    if not totals["steps"]:
        return None
    return totals[key] / totals["steps"] / scale


def _analyze(path: str) -> Analysis:
    """Return the analysis of the trace in ``path``.

    Raises:
        OSError: it cannot be read.
        ValueError: it is not a trace, not hpcrep's, or holds no step or collective (the
            message says which and how to record one).
    """
    events = load(path)
    try:
        result = analyze(events)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not an hpcrep timeline: an event lacks or has a bad field "
                         f"({type(exc).__name__}: {exc})") from None
    if not result.step_numbers() and not result.per_kind:
        raise ValueError(
            f"{path} holds no training step and no collective ({len(events)} events): record "
            "one with HPCREP_TIMELINE=FILE or hpcrep run --timeline-filename FILE, from a job "
            "that trains at least one step (HPCREP_TIMELINE_STEPS may have left every step "
            "out)")
    return result


def main(args: Any) -> int:
    """Print the analysis (and write the PNG); 2 if a trace cannot be read."""
    try:
        first = _analyze(args.trace)
        second = _analyze(args.against) if args.against else None
    except (OSError, ValueError) as exc:
        print(f"hpcrep analyze: {exc}", file=sys.stderr)
        return 2
    print(render(first, args.max_steps))
    if second is not None:
        print(f"\n{args.trace} against {args.against}:\n")
        print(render_against(first, second, "this", "against"))
    if args.png:
        from hpcrep.analysis.plot import draw  # noqa: PLC0415 - matplotlib only when asked

        draw(first, args.png, second)
        print(f"\nwrote {args.png}")
    return 0
