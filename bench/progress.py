"""Where a benchmark run is: jobs done of all, time elapsed, and an estimate of the time left.

The estimate charges each job still to come the time its own kind took (the same model, rank
count and variant in an earlier repeat) where one has run, else the mean of the jobs run so far.
"""

from __future__ import annotations

import time
from typing import Callable, Optional


class Progress:
    """Counts a run's jobs as they end and prints a progress line after each. Local."""

    def __init__(self, kinds: list[str], clock: Callable[[], float] = time.monotonic,
                 out: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        """``kinds``: one entry per job the run will make, in any order (a job's kind names
        what makes jobs alike in length, e.g. ``"resnet50 x2 hpcrep,nosync"``)."""
        self._todo = list(kinds)
        self._took: dict[str, list[float]] = {}
        self._clock, self._out = clock, out
        self._start = clock()
        self.total = len(kinds)

    @property
    def done(self) -> int:
        return sum(len(times) for times in self._took.values())

    def finished(self, kind: str, seconds: float, ok: bool = True) -> str:
        """Record that a job of ``kind`` ended after ``seconds`` (failed: ``ok`` False); print
        and return the progress line."""
        if kind in self._todo:
            self._todo.remove(kind)
        self._took.setdefault(kind, []).append(seconds)
        line = (f"bench: progress {self.done}/{self.total} jobs"
                + ("" if ok else " (the last one failed)")
                + f", {_minutes(self._clock() - self._start)} elapsed")
        left = self.seconds_left()
        if left is not None:
            line += f", about {_minutes(left)} left"
        self._out(line)
        return line

    def seconds_left(self) -> Optional[float]:
        """Return the estimated seconds the jobs still to come will take; None before the first
        job has ended. Pure."""
        if not self._took:
            return None
        every = [t for times in self._took.values() for t in times]
        mean = sum(every) / len(every)
        return sum(_mean(self._took[k]) if k in self._took else mean for k in self._todo)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _minutes(seconds: float) -> str:
    """``"42 s"`` under a minute, ``"7.5 min"`` above."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
