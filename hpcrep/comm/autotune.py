"""Autotuning of the gradient exchange (``HPCREP_AUTOTUNE``): which fusion threshold and piece
size make training steps fastest, searched and re-searched from measured step times while the
job trains.

The best settings depend on the network (``docs/measurements.md``: across a 1 Gb/s link 1 MiB
pieces ran at the link's rate whatever the threshold, hpcrep's defaults took 1.49x the best
cell; within one node the best threshold was 64-256 MiB), and on the model. So instead of one
warm-up search frozen for good (Horovod's), the tuner keeps watching the step time and searches
again when it drifts.

Two layers, no TensorFlow here:

- :class:`Search` is rank 0's side and pure: fed one step period at a time, it answers at each
  boundary with a :class:`Decision` (the setting to use and how many steps until the next
  boundary). A search times the starting setting, then every piece size at its threshold, every
  threshold (from the starting one up) at the best piece size, every piece size at the best
  threshold, each for
  ``warmup`` + ``measure`` steps (the median of the last ``measure`` periods is its score), and
  settles on the best (with ``allow_fp16``, a fourth phase times the best with float16 on the
  wire); settled, it compares the median of each ``window`` steps with the best
  score and searches again after two windows more than ``drift`` slower.
- :class:`StepTuner` runs on every rank, once per training step (:meth:`StepTuner.tick`): it
  times the step on rank 0 and, at boundaries, shares rank 0's decision with one 4-number Sum
  allreduce on the Python path (which ranks waiting in ``join()`` take part in), so every rank
  applies the same setting from the same step on.

:mod:`hpcrep.tensorflow.autotune` calls :meth:`StepTuner.tick` at the start of each gradient
exchange and hands the setting to the compiled engine.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional

import numpy as np

MIB = 1 << 20
FUSION_CHOICES = (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
CHUNK_CHOICES = (1 * MIB, 4 * MIB, 16 * MIB, 0)  # 0: each fusion buffer in one MPI call


def _mib(nbytes: int) -> str:
    return "whole buffer" if nbytes == 0 else f"{nbytes / MIB:g} MiB"


@dataclasses.dataclass(frozen=True)
class Setting:
    """A fusion threshold and a piece size, in bytes (piece size 0: no limit), and whether
    float32 gradients travel as float16 (only where the user allowed it)."""

    fusion: int
    chunk: int
    fp16: bool = False

    def __str__(self) -> str:
        return f"fusion {_mib(self.fusion)}, pieces {_mib(self.chunk)}" + (
            ", float16 on the wire" if self.fp16 else "")


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank uses from a boundary on, and how many steps until the next one."""

    setting: Setting
    steps: int


@dataclasses.dataclass(frozen=True)
class Trial:
    """One timed setting of a search: its score is the median step period in seconds."""

    step: int
    setting: Setting
    score: float


class Search:
    """Rank 0's search (see the module docstring). Local: only rank 0 runs one.

    Args:
        start: the setting the job starts with (the configured one).
        warmup: steps after a change that are not timed.
        measure: steps timed per setting.
        window: steps per comparison once settled.
        drift: relative slow-down over the best score that starts a new search (two windows
            running).
        log: called with a line for each timed setting and each settlement.
        allow_fp16: also time the best setting with float32 gradients sent as float16 (a last
            phase; it changes results as ``Compression.fp16`` does, so only when allowed).
    """

    def __init__(self, start: Setting, warmup: int = 2, measure: int = 5, window: int = 20,
                 drift: float = 0.15, log: Optional[Callable[[str], None]] = None,
                 allow_fp16: bool = False) -> None:
        if warmup < 0 or measure < 1 or window < 1 or drift <= 0:
            raise ValueError(f"autotune needs warmup >= 0, measure >= 1, window >= 1 and "
                             f"drift > 0 (got {warmup}, {measure}, {window}, {drift})")
        self.warmup, self.measure, self.window, self.drift = warmup, measure, window, drift
        self.log = log or (lambda line: None)
        self.phases = 4 if allow_fp16 else 3
        # The buckets are traced at the starting threshold; the engine can fuse them into larger
        # buffers (a copy in and out), never cut them smaller, so smaller thresholds are not
        # choices.
        self.fusion_choices = [f for f in FUSION_CHOICES if f >= start.fusion] or [start.fusion]
        self.trials: list[Trial] = []       # every timed setting, all searches
        self.searches = 0
        self.settled_at: Optional[int] = None  # step of the last settlement
        self.frozen = False
        self._periods: list[float] = []
        self._step = 0
        self._start_search(start)

    # The search's state: the setting being timed, the queue after it, the scores so far.
    def _start_search(self, start: Setting) -> None:
        self.searches += 1
        self._scores: dict[Setting, float] = {}
        self._phase = 0
        self._queue = [start]
        self._current = start
        self._best: Optional[Setting] = None
        self._strikes = 0

    @property
    def current(self) -> Setting:
        """The setting in use."""
        return self._current

    @property
    def settled(self) -> bool:
        """Whether the last search has ended (the tuner only watches for drift)."""
        return self._best is not None

    @property
    def best(self) -> Optional[tuple[Setting, float]]:
        """The setting the last search settled on and its score (seconds), or None."""
        return None if self._best is None else (self._best, self._scores[self._best])

    def first(self) -> Decision:
        """The decision at step 0: time the starting setting."""
        return Decision(self._current, self.warmup + self.measure)

    def observe(self, period: float) -> None:
        """Record one step's period in seconds (from the start of one step to the next)."""
        self._step += 1
        self._periods.append(period)
        del self._periods[:-max(self.window, self.warmup + self.measure)]

    def decide(self) -> Decision:
        """At a boundary: score what ran since the last one and say what runs next."""
        if self.frozen:
            return Decision(self._current, self.window)
        if self._best is not None:
            return self._watch()
        score = statistics.median(self._periods[-self.measure:])
        self._scores[self._current] = score
        self.trials.append(Trial(self._step, self._current, score))
        self.log(f"step {self._step}: {self._current}: {score * 1e3:.1f} ms per step")
        self._queue.pop(0)
        while not self._queue and self._phase < self.phases:
            self._phase += 1
            self._queue = [s for s in self._next_phase() if s not in self._scores]
        if self._queue:
            self._current = self._queue[0]
            return Decision(self._current, self.warmup + self.measure)
        return self._settle()

    def _next_phase(self) -> list[Setting]:
        """Phase 1: every piece size at the starting threshold; 2: every threshold at the best
        piece size; 3: every piece size at the best threshold; 4 (if allowed): the best with
        float16 on the wire."""
        best = min(self._scores, key=self._scores.__getitem__)
        if self._phase == 2:
            return [Setting(f, best.chunk, best.fp16) for f in self.fusion_choices]
        if self._phase == 4:
            return [Setting(best.fusion, best.chunk, True)]
        return [Setting(best.fusion, c, best.fp16) for c in CHUNK_CHOICES]

    def _settle(self) -> Decision:
        best = min(self._scores, key=self._scores.__getitem__)
        start = self.trials[-len(self._scores)]
        self._best, self._current, self.settled_at = best, best, self._step
        gain = start.score / self._scores[best]
        self.log(f"step {self._step}: settled on {best}: {self._scores[best] * 1e3:.1f} ms per "
                 f"step, {gain:.2f}x the search's starting setting ({start.setting}: "
                 f"{start.score * 1e3:.1f} ms), after {len(self._scores)} settings")
        return Decision(best, self.window)

    def _watch(self) -> Decision:
        assert self._best is not None
        recent = statistics.median(self._periods[-self.window:])
        reference = self._scores[self._best]
        self._strikes = self._strikes + 1 if recent > reference * (1 + self.drift) else 0
        if self._strikes < 2:
            return Decision(self._current, self.window)
        self.log(f"step {self._step}: step time drifted from {reference * 1e3:.1f} to "
                 f"{recent * 1e3:.1f} ms: searching again")
        self._start_search(self._best)
        return self.first()


class StepTuner:
    """Every rank's side: call :meth:`tick` once per training step, at the same point of the
    step on every rank; it returns the setting to use for this step's exchange.

    Args:
        communicator: the ranks that exchange gradients together (a
            :class:`hpcrep.comm.Communicator`); its rank 0 decides.
        start: the configured setting.
        search: keyword arguments of :class:`Search` (``log`` included), used on rank 0.
    """

    def __init__(self, communicator: Any, start: Setting, **search: Any) -> None:
        self.communicator = communicator
        self.search = Search(start, **search) if communicator.rank() == 0 else None
        self.setting = start
        self.steps = 0           # ticks so far
        self._next = 0           # the tick at which the next decision is shared
        self._last: Optional[float] = None
        self.history: list[tuple[int, Setting]] = []  # (tick, setting) at each change

    def history_settings(self) -> list[Setting]:
        """The settings used so far, in the order they were first used. Local."""
        return list(dict.fromkeys(setting for _, setting in self.history))

    def tick(self) -> Setting:
        """Count a step; at a boundary, share rank 0's decision. Collective at boundaries
        (every rank of the communicator ticks the same number of times), local otherwise."""
        now = time.perf_counter()
        if self.search is not None and self._last is not None:
            self.search.observe(now - self._last)
        if self.steps == self._next:
            self._share(self.steps == 0)
        self.steps += 1
        self._last = time.perf_counter()
        return self.setting

    def _share(self, first: bool) -> None:
        from hpcrep.comm import collectives  # noqa: PLC0415
        from hpcrep.comm.ops import ReduceOp  # noqa: PLC0415

        message = np.zeros(4, np.int64)
        if self.search is not None:
            decision = self.search.first() if first else self.search.decide()
            message[:] = (decision.setting.fusion, decision.setting.chunk, decision.steps,
                          decision.setting.fp16)
        shared = collectives.allreduce(message, ReduceOp.Sum, name="hpcrep.autotune",
                                       communicator=self.communicator)
        if shared[0] == 0:  # rank 0 waits in join(): keep the setting, look again later
            self._next = self.steps + 1
            return
        setting = Setting(int(shared[0]), int(shared[1]), bool(shared[3]))
        if setting != self.setting or not self.history:
            self.history.append((self.steps, setting))
        self.setting = setting
        self._next = self.steps + int(shared[2])
