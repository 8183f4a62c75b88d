"""``HPCREP_AUTOTUNE`` in TensorFlow: tick the tuner at each gradient exchange and hand its
setting to the compiled engine.

:class:`hpcrep.tensorflow.gradients.GradientReducer` (DistributedOptimizer,
DistributedGradientTape, transparent mode) puts a tick (:func:`tick_op`) before the step's
buckets: a ``tf.numpy_function`` that runs :meth:`hpcrep.comm.autotune.StepTuner.tick` and
:func:`hpcrep.tensorflow.native.tune`, and every bucket's exchange waits for it. The buckets are
traced inside :func:`tuned_scope`: planned at ``HPCREP_FUSION_THRESHOLD`` as always and marked
``tuned``, so the engine fuses them up to the tuned threshold (never below the traced one) and
cuts them into the tuned pieces; where ``HPCREP_AUTOTUNE_COMPRESSION`` allows it, the engine
may also send their float32 values as float16 (packed, summed and unpacked inside the engine).
(Planning small buckets so that the tuner could choose small
thresholds cost more than it could win on one node: 1 MiB buckets made ResNet-50's exchange
10-15 ms slower than 16 MiB ones, and fusing them again costs a copy in and out.)

The tick depends on the step's first gradient, so it runs after the
previous step's exchange has finished on this rank and before any of this step's is queued: on
every rank the same requests see the same setting, and the ranks stay bitwise equal.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator, Optional

import tensorflow as tf

from hpcrep import config
from hpcrep.comm import autotune as search
from hpcrep.tensorflow import native

_scope = threading.local()
_lock = threading.Lock()
_tuners: dict[int, search.StepTuner] = {}
_warned: list[bool] = []


@contextlib.contextmanager
def tuned_scope() -> Iterator[None]:
    """Trace the compiled allreduces inside this block as tuned (see the module). Local."""
    depth = getattr(_scope, "depth", 0)
    _scope.depth = depth + 1
    try:
        yield
    finally:
        _scope.depth = depth


def in_tuned_scope() -> bool:
    """Return True inside :func:`tuned_scope` on this thread. Local."""
    return getattr(_scope, "depth", 0) > 0


def enabled() -> bool:
    """Return True if gradient exchanges are tuned: ``HPCREP_AUTOTUNE`` and the compiled path.
    With the setting on and the compiled path off, says so once on stderr. Local."""
    if not config.get("HPCREP_AUTOTUNE"):
        return False
    if native.active():
        return True
    if not _warned:
        _warned.append(True)
        print("hpcrep: HPCREP_AUTOTUNE is ignored: it tunes the compiled path, which is off "
              f"here ({native.status()[1]})", file=sys.stderr, flush=True)
    return False


def tick_op(communicator: Any, after: Any) -> tf.Tensor:
    """Return an op that ticks ``communicator``'s tuner once ``after`` exists (a tensor of the
    step: its first gradient). Collective when it runs at a boundary: every rank of the
    communicator runs the same traced step."""
    return tf.numpy_function(lambda _: _tick(communicator), [tf.size(after)], tf.int64,
                             stateful=True, name="hpcrep_autotune_tick")


def _tick(communicator: Any) -> Any:
    import numpy as np  # noqa: PLC0415

    setting = tuner(communicator).tick()
    native.tune(communicator, setting.fusion, setting.chunk, setting.fp16)
    return np.int64(setting.fusion)


def tuner(communicator: Any) -> search.StepTuner:
    """Return ``communicator``'s tuner, making it on first use (local)."""
    key = id(communicator)
    with _lock:
        found = _tuners.get(key)
        if found is not None and found.communicator is communicator:
            return found
    start = search.Setting(int(config.get("HPCREP_FUSION_THRESHOLD")),
                           int(config.get("HPCREP_ALLREDUCE_CHUNK")))
    made = search.StepTuner(communicator, start, warmup=int(config.get("HPCREP_AUTOTUNE_WARMUP")),
                            measure=int(config.get("HPCREP_AUTOTUNE_STEPS")),
                            window=int(config.get("HPCREP_AUTOTUNE_WINDOW")),
                            allow_fp16=bool(config.get("HPCREP_AUTOTUNE_COMPRESSION")),
                            log=_logger(communicator))
    with _lock:
        _tuners[key] = made
    communicator.at_free(lambda: _tuners.pop(key, None))
    return made


def _logger(communicator: Any):
    """Rank 0's log: one stderr line per timed setting and settlement, and the CSV file of
    ``HPCREP_AUTOTUNE_LOG`` (step, fusion bytes, piece bytes, median step ms) if set."""
    path = str(config.get("HPCREP_AUTOTUNE_LOG"))
    if path and communicator.rank() == 0:
        with open(path, "w", encoding="utf-8") as f:
            f.write("step,fusion_bytes,chunk_bytes,fp16,step_ms\n")

    written = [0]

    def log(line: str) -> None:
        print(f"hpcrep: autotune: {line}", file=sys.stderr, flush=True)
        made = _tuners.get(id(communicator))
        if not path or made is None or made.search is None:
            return
        with open(path, "a", encoding="utf-8") as f:
            for trial in made.search.trials[written[0]:]:
                f.write(f"{trial.step},{trial.setting.fusion},{trial.setting.chunk},"
                        f"{int(trial.setting.fp16)},{trial.score * 1e3:.3f}\n")
        written[0] = len(made.search.trials)
    return log


def reset() -> None:
    """Forget every tuner: the next tick of each communicator starts a new one from the
    configured setting (tests and benchmarks that tune several runs in one process). Local;
    call it on every rank at the same point, between steps."""
    with _lock:
        _tuners.clear()


def freeze(frozen: bool = True) -> None:
    """Keep every tuner on its present setting (benchmarks time a settled tuner beside fixed
    settings without its periods mixing with theirs). Local; only rank 0's search decides."""
    with _lock:
        for made in _tuners.values():
            if made.search is not None:
                made.search.frozen = frozen


def current(communicator: Optional[Any] = None) -> Optional[search.StepTuner]:
    """Return the tuner of ``communicator`` (default: the world's), or None before its first
    tick. Local."""
    from hpcrep.comm import world  # noqa: PLC0415

    communicator = communicator or world.communicator()
    with _lock:
        found = _tuners.get(id(communicator))
    return found if found is not None and found.communicator is communicator else None
