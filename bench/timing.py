"""Timing of training steps inside a benchmark job: variants interleaved over repeated rounds,
warm-up until step times settle, the slowest rank counted, the machine's load recorded.

The pure parts (:func:`interleaved_order`, :func:`settled`, :func:`spread`) are what the
collective ones (:func:`warm_up`, :func:`time_rounds`) and ``bench.allreduce``/``bench.overlap``
build on."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

# Warm-up: a variant is warm when the median of its last WINDOW step times differs from the
# median of the WINDOW before by less than TOLERANCE (relative), or after CAP steps.
WINDOW, TOLERANCE, CAP = 3, 0.05, 40


def interleaved_order(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order the variants run in each of ``rounds`` rounds: every round runs each name once,
    rotated by one place per round, so that each variant takes every position equally often (a
    slow spell, or a variant that leaves caches cold for the next, hits all alike). Local."""
    names = list(names)
    if rounds < 1 or not names:
        raise ValueError(f"need rounds >= 1 and some variants, got rounds={rounds}, {names}")
    k = len(names)
    return [names[r % k:] + names[:r % k] for r in range(rounds)]


def settled(times: Sequence[float], window: int = WINDOW, tolerance: float = TOLERANCE) -> bool:
    """True if the median of the last ``window`` of ``times`` differs from the median of the
    ``window`` before it by less than ``tolerance`` of the latter (False with fewer than
    ``2 * window`` times). Local."""
    if window < 1 or len(times) < 2 * window:
        return False
    last = float(np.median(times[-window:]))
    before = float(np.median(times[-2 * window:-window]))
    return before > 0 and abs(last - before) / before < tolerance


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max"}`` of ``values`` (at least one). Local."""
    if len(values) == 0:
        raise ValueError("spread of no values")
    return {"median": float(np.median(values)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def warm_up(step: Callable[[], object], window: int = WINDOW, tolerance: float = TOLERANCE,
            cap: int = CAP) -> list[float]:
    """Run ``step`` until :func:`settled` holds for the slowest rank's step times, or ``cap``
    steps; return those times (ms).

    Collective: every rank must call this; every rank sees the same (slowest-rank) times, so all
    stop after the same step.
    """
    times: list[float] = []
    while len(times) < max(cap, 1):
        start = time.perf_counter()
        step()
        times.append(float(_max_over_ranks(np.array([time.perf_counter() - start]))[0]) * 1e3)
        if settled(times, window, tolerance):
            break
    return times


def time_rounds(steps: dict[str, Callable[[], object]], rounds: int, steps_per_round: int,
                items_per_step: float) -> dict[str, dict]:
    """Time every step of ``steps`` (name -> one training step) over ``rounds`` rounds in
    :func:`interleaved_order`, ``steps_per_round`` steps per variant per round (each warmed up
    first with :func:`warm_up`).

    A step's time is the slowest rank's; a round's figure is the median of its steps; each
    variant's figure is the median over rounds with the rounds' min and max.

    Collective: every rank must call this, with the same names and counts.

    Returns:
        name -> ``step_ms`` (median over rounds), ``step_ms_min``, ``step_ms_max``,
        ``round_ms`` (each round's median, in round order), ``throughput`` (items/s of the whole
        job at the median, ``throughput_min``/``throughput_max`` at the slowest/fastest round),
        ``items_per_step``,
        ``warmup_ms`` (the warm-up steps' times), ``rounds``, ``steps_per_round``,
        ``step_times_ms`` (every timed step, in order) and ``threads_per_rank``.
    """
    if steps_per_round < 1:
        raise ValueError(f"need steps_per_round >= 1, got {steps_per_round}")
    order = interleaved_order(list(steps), rounds)
    warm = {name: warm_up(fn) for name, fn in steps.items()}
    raw = {name: np.empty((rounds, steps_per_round)) for name in steps}
    for r, names in enumerate(order):
        for name in names:
            _barrier()
            for i in range(steps_per_round):
                start = time.perf_counter()
                steps[name]()
                raw[name][r, i] = time.perf_counter() - start
    threads = _threads_per_rank()
    out = {}
    for name, times in raw.items():
        times = _max_over_ranks(times.ravel()).reshape(rounds, steps_per_round) * 1e3
        per_round = [float(np.median(row)) for row in times]
        s = spread(per_round)
        out[name] = {"step_ms": s["median"], "step_ms_min": s["min"], "step_ms_max": s["max"],
                     "round_ms": per_round,
                     "throughput": items_per_step / s["median"] * 1e3,
                     "throughput_min": items_per_step / s["max"] * 1e3,
                     "throughput_max": items_per_step / s["min"] * 1e3,
                     "items_per_step": items_per_step,
                     "warmup_ms": warm[name], "rounds": rounds,
                     "steps_per_round": steps_per_round,
                     "step_times_ms": [float(t) for t in times.ravel()],
                     "threads_per_rank": threads}
    return out


def load_snapshot(sample_s: float = 3.0) -> dict:
    """The machine's load now: ``os.getloadavg()`` and the share of all cores busy (``/proc/stat``
    via :func:`machine_busy_seconds`) over the next ``sample_s`` seconds (None where /proc has no
    such files). Local."""
    before, start = machine_busy_seconds(), time.perf_counter()
    time.sleep(sample_s)
    after, wall = machine_busy_seconds(), time.perf_counter() - start
    busy = None
    if before[0] and before[0] == after[0] and after[2]:
        busy = (after[1] - before[1]) / (wall * after[2])
    return {"load_average": [round(x, 2) for x in os.getloadavg()],
            "busy_fraction": None if busy is None else round(min(max(busy, 0.0), 1.0), 3),
            "cores": os.cpu_count() or 0}


def load_is_high(snapshot: dict, cores: int, use_load_average: bool = True) -> bool:
    """True if ``snapshot`` (:func:`load_snapshot`, taken while the benchmark was not running)
    shows other work: more than 25% of the cores busy while it was sampled. Only where that share
    is unknown (no /proc/stat), and ``use_load_average`` (False right after the benchmark, whose
    own ranks the 1-minute average still counts), a 1-minute load average above a quarter of
    ``cores``: that average lags by a minute, so it also counts work that ended just before the
    run, which disturbs nothing. Local."""
    busy = snapshot.get("busy_fraction")
    if busy is not None:
        return busy > 0.25
    load = (snapshot.get("load_average") or [0.0])[0] if use_load_average else 0.0
    return load > 0.25 * max(cores, 1)


def _threads_per_rank() -> Optional[int]:
    """TensorFlow's intra-op threads if every rank has the same number, else None.

    Collective: every rank must call this. TensorFlow is not imported here: a job that does not
    load it (or has not set the pool: 0) reports None.
    """
    from mpi4py import MPI  # noqa: PLC0415

    tf = sys.modules.get("tensorflow")
    threads = tf.config.threading.get_intra_op_parallelism_threads() if tf is not None else 0
    lo_hi = np.array([threads, -threads], dtype=np.int64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, lo_hi, op=MPI.MIN)
    lo, hi = int(lo_hi[0]), -int(lo_hi[1])
    return lo if lo == hi and lo > 0 else None


def _barrier() -> None:
    from mpi4py import MPI  # noqa: PLC0415

    MPI.COMM_WORLD.Barrier()


def _max_over_ranks(values: np.ndarray) -> np.ndarray:
    from mpi4py import MPI  # noqa: PLC0415

    out = np.array(values, dtype=np.float64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, out, op=MPI.MAX)
    return out


class Stopwatch:
    """Accumulates the seconds spent inside ``with watch:`` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> "Stopwatch":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._start

    def take(self) -> float:
        """Return the accumulated seconds and reset to zero."""
        value, self.seconds = self.seconds, 0.0
        return value


def machine_busy_seconds() -> tuple[str, float, int]:
    """Return this machine's identity (its kernel's boot id), the CPU seconds its cores have
    spent busy since boot (``/proc/stat``: user, nice, system, irq, softirq and steal, so the
    kernel's network work counts too) and its core count. Network namespaces on one machine (the
    test cluster's nodes) share all three. ``("", 0.0, 0)`` where ``/proc`` has no such files.
    Local."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return "", 0.0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return boot_id, busy / os.sysconf("SC_CLK_TCK"), os.cpu_count() or 0


def busy_seconds_between(comm: object, before: tuple[str, float, int],
                         after: tuple[str, float, int]) -> tuple[float, int]:
    """Return the CPU seconds every machine in the job spent busy between two
    :func:`machine_busy_seconds` readings, summed over distinct machines (ranks that share a
    machine count it once), and those machines' total core count. ``(0.0, 0)`` if some rank
    could not read them. Collective over ``comm`` (an mpi4py communicator)."""
    readings = comm.allgather((after[0] if after[0] == before[0] else "",
                               after[1] - before[1], after[2]))
    if any(not machine for machine, _, _ in readings):
        return 0.0, 0
    machines = {machine: (busy, cores) for machine, busy, cores in readings}
    return (sum(busy for busy, _ in machines.values()),
            sum(cores for _, cores in machines.values()))
