"""The campaign's report: ``report.json`` (every trial's record) and ``report.md`` (a table per
fault kind x recovery mode x feature set, and the replay command of every failing trial)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

# Outcomes that are not failures: the trial passed, or the job refused the combination at start
# with an error, or (where a mode allows it) ended without a result after a fault at start-up.
NOT_FAILED = ("pass", "refused", "aborted-ok")


def failed(record: dict) -> bool:
    """True if the trial's outcome is a failure."""
    return record["outcome"] not in NOT_FAILED


def _seconds(values: list[float]) -> str:
    if not values:
        return "-"
    v = np.asarray(values)
    return f"{np.median(v):.1f} / {np.percentile(v, 95):.1f} / {v.max():.1f}"


def rows(records: list[dict]) -> list[dict]:
    """One summary per (fault kind, mode, features), in a stable order."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        t = r["trial"]
        groups.setdefault((t["kind"], t["mode"], t["features"]), []).append(r)
    out = []
    for (kind, mode, features), group in sorted(groups.items()):
        count = {o: sum(r["outcome"] == o for r in group) for o in
                 ("pass", "hang", "wrong-weights", "rows", "orphans", "refused", "aborted",
                  "aborted-ok", "unreadable", "no-reference")}
        lost = sum((r.get("ledger") or {}).get("lost", 0) for r in group)
        dup = sum((r.get("ledger") or {}).get("duplicated", 0) for r in group)
        times = [r["recovery_seconds"] for r in group if r.get("recovery_seconds") is not None]
        out.append({"kind": kind, "mode": mode, "features": features, "trials": len(group),
                    **count, "lost": lost, "duplicated": dup,
                    "orphan_processes": sum(len(r.get("orphans", [])) for r in group),
                    "missed_faults": sum(r.get("missed", 0) for r in group),
                    "recovery": _seconds(times)})
    return out


def write(directory: Path, records: list[dict], seed: int, wall: float,
          note: Optional[str] = None) -> Path:
    """Write report.json and report.md into ``directory``; return the markdown's path."""
    directory.mkdir(parents=True, exist_ok=True)
    table = rows(records)
    (directory / "report.json").write_text(json.dumps(
        {"seed": seed, "wall_seconds": wall, "summary": table, "trials": records},
        indent=1, default=str))
    lines = [f"# Chaos campaign, seed {seed}", "",
             f"{len(records)} trials, {sum(not failed(r) for r in records)} without failure, "
             f"{wall:.0f} s wall time." + (f" {note}" if note else ""), "",
             "Recovery: seconds from the (first) fault to the first step after recovery "
             "(relaunch: the first epoch end), median / p95 / max. Rows lost/dup: per-row ledger "
             "(ulfm explicit: rows; relaunch: epochs). Missed: faults the job outran.", "",
             "| fault | mode | features | trials | passed | hung | wrong weights | rows lost/dup "
             "| orphans | refused | aborted | other | missed | recovery s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        other = r["unreadable"] + r["no-reference"] + r["aborted-ok"]
        lines.append(f"| {r['kind']} | {r['mode']} | {r['features']} | {r['trials']} | "
                     f"{r['pass']} | {r['hang']} | {r['wrong-weights']} | {r['lost']}/"
                     f"{r['duplicated']} | {r['orphan_processes']} | {r['refused']} | "
                     f"{r['aborted']} | {other} | {r['missed_faults']} | {r['recovery']} |")
    bad = [r for r in records if failed(r)]
    lines += ["", f"## Failing trials ({len(bad)})", ""]
    for r in bad:
        t = r["trial"]
        why = "; ".join(r.get("problems") or []) or \
            " ".join((r.get("why") or "").strip().splitlines()[-1:])
        lines.append(f"- `{t['name']}` {t['mode']}/{t['features']}/{t['kind']} "
                     f"({', '.join(f['when'] for f in t['faults'])}): **{r['outcome']}** {why}  ")
        lines.append(f"  replay: `{t['replay']}`")
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
