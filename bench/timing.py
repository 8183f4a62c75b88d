"""Timing of training steps inside a benchmark job: warm-up excluded, slowest rank counted."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

import numpy as np


def time_steps(step: Callable[[], float], steps: int, warmup: int,
               items_per_step: float) -> dict:
    """Run ``warmup + steps`` calls of ``step`` and summarise the timed ones.

    ``step`` returns the seconds it spent communicating (0 when it does not). Each step's wall
    time and communication time are taken as the maximum over ranks (the slowest rank sets the
    pace), then the median over timed steps is reported.

    Collective: every rank must call this, with the same ``steps`` and ``warmup``.

    Returns:
        ``step_ms``, ``comm_ms``, ``compute_ms``, ``comm_fraction``, ``throughput`` (items/s for
        the whole job, ``items_per_step`` being the global items of one step), the raw
        ``step_times_ms``, and ``threads_per_rank`` (TensorFlow's intra-op threads on every
        rank, None if they differ across ranks or TensorFlow is not loaded), which the report
        checks before it compares rank counts.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    for _ in range(warmup):
        step()
    walls = np.empty(steps)
    comms = np.empty(steps)
    _barrier()
    for i in range(steps):
        start = time.perf_counter()
        comms[i] = step()
        walls[i] = time.perf_counter() - start
    walls, comms = _max_over_ranks(walls), _max_over_ranks(comms)
    step_s = float(np.median(walls))
    comm_s = float(np.median(comms))
    return {
        "step_ms": step_s * 1e3,
        "comm_ms": comm_s * 1e3,
        "compute_ms": max(step_s - comm_s, 0.0) * 1e3,
        "comm_fraction": comm_s / step_s if step_s > 0 else 0.0,
        "throughput": items_per_step / step_s if step_s > 0 else 0.0,
        "steps": steps,
        "warmup": warmup,
        "step_times_ms": [float(t * 1e3) for t in walls],
        "threads_per_rank": _threads_per_rank(),
    }


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
