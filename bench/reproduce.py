"""Does a benchmark run reproduce an earlier one? Each summary ratio of the later run (hpcrep over
a peer, per model and rank count: the median over its rounds) is checked against the earlier
run's reported range for the same figure (min-max over all its rounds and jobs).

``hpcrep report LATER --against EARLIER`` prints the table; ``make bench`` twice back to back
passes when every summary ratio of the second run lies inside the first run's range.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple


class Check(NamedTuple):
    """One summary ratio of the later run against the earlier run's range."""

    model: str
    ranks: str
    peer: str
    earlier: dict[str, Any]
    later: dict[str, Any]

    @property
    def inside(self) -> bool:
        """True when the later median lies within the earlier [min, max]."""
        return self.earlier["min"] <= self.later["median"] <= self.earlier["max"]


def checks(earlier: dict, later: dict) -> Iterator[Check]:
    """Yield a :class:`Check` for every (model, peer, ranks) ratio that both reports hold."""
    for model, data in later.get("models", {}).items():
        before = earlier.get("models", {}).get(model, {}).get("ratios", {})
        for peer, by_ranks in data.get("ratios", {}).items():
            for ranks, figure in sorted(by_ranks.items(), key=lambda kv: int(kv[0])):
                old = before.get(peer, {}).get(ranks)
                if old and figure and "median" in figure and "min" in old:
                    yield Check(model, ranks, peer, old, figure)


def table(earlier: dict, later: dict) -> str:
    """Return the markdown table of every check and a last line counting those inside."""
    rows = ["| model | ranks | hpcrep over | earlier median [min-max] | later median [min-max] "
            "| later median in earlier range |", "|---|---|---|---|---|---|"]
    found = list(checks(earlier, later))
    for c in found:
        rows.append(f"| {c.model} | {c.ranks} | {c.peer} | {_fmt(c.earlier)} | {_fmt(c.later)} | "
                    f"{'yes' if c.inside else '**no**'} |")
    inside = sum(c.inside for c in found)
    rows.append("")
    rows.append(f"{inside} of {len(found)} summary ratios of the later run lie inside the "
                "earlier run's range.")
    return "\n".join(rows)


def _fmt(figure: dict) -> str:
    return f"{figure['median']:.2f} [{figure['min']:.2f}-{figure['max']:.2f}]"
