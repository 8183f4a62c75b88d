"""What a doctor check returns, and how the doctor prints and scores a set of them.

Pure functions: nothing here runs a command or communicates.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
_LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}


@dataclasses.dataclass(frozen=True)
class Result:
    """One check's outcome: its name, a status (ok, warn, fail, skip), a one-line finding and a
    one-line fix (empty when there is nothing to do)."""

    name: str
    status: str
    finding: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in _LABELS:
            raise ValueError(f"doctor check {self.name!r}: status {self.status!r}; expected one "
                             f"of {', '.join(_LABELS)}")


def line(result: Result) -> str:
    """Return ``result`` as the doctor prints it: ``STATUS name: finding; fix: ...``."""
    text = f"{_LABELS[result.status]:<4} {result.name}: {result.finding}"
    return f"{text}; fix: {result.fix}" if result.fix else text


def exit_code(results: Sequence[Result]) -> int:
    """Return 1 if any check failed (a job would fail), else 0 (ok, warnings, skipped checks)."""
    return 1 if any(r.status == FAIL for r in results) else 0


def summary(results: Sequence[Result]) -> str:
    """Return the closing line: how many checks had each status, and what that means."""
    counts = {s: sum(r.status == s for r in results) for s in _LABELS}
    tally = ", ".join(f"{n} {_LABELS[s]}" for s, n in counts.items() if n)
    if counts[FAIL]:
        verdict = "a job would fail here: fix the FAIL lines first"
    elif counts[WARN]:
        verdict = "a job would run, but read the warnings"
    else:
        verdict = "ready to run"
    return f"hpcrep doctor: {tally}: {verdict}"


def to_json(results: Sequence[Result]) -> str:
    """Return the checks, the summary and the exit code as one JSON document."""
    return json.dumps({"checks": [dataclasses.asdict(r) for r in results],
                       "summary": summary(results), "exit_code": exit_code(results)}, indent=1)
