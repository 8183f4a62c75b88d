"""Transparent ``fit`` that goes on after a failed rank (``python -m hpcrep --elastic``, ULFM).

With ``HPCREP_TRANSPARENT_ELASTIC`` in a job that can outlive a rank
(:func:`hpcrep.comm.recovery.enabled`), :func:`fit` runs the patched ``fit`` in attempts: the
model's and optimizer's variables are committed in memory at the end of every epoch (and before
the first, where the model is built); when a rank fails, every survivor returns to the last
commit, the job shrinks to the survivors (:func:`hpcrep.comm.recovery.recover`), the learning
rate follows the new size where ``HPCREP_TRANSPARENT_SCALE_LR`` scaled it, the survivors sync
from the new rank 0 and ``fit`` starts again at the committed epoch with the input sharded over
the new ranks (the batch per rank stays, the global batch shrinks). A failure in the first epoch
of a model built only by ``fit`` has nothing to go back to: the epoch starts again from the
weights the new rank 0 has.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import keras

from hpcrep import comm, config
from hpcrep.comm import recovery
from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow._keras.elastic import TensorFlowKerasState

_warned = False


def requested() -> bool:
    """Return True if ``HPCREP_TRANSPARENT_ELASTIC`` asks for it; warns once (rank 0) where the
    job cannot outlive a rank. Local."""
    global _warned
    if not config.get("HPCREP_TRANSPARENT_ELASTIC"):
        return False
    if recovery.enabled():
        return True
    if not _warned and comm.rank() == 0:
        print("hpcrep: --elastic: this job cannot outlive a rank (its MPI has no ULFM, or it was "
              "not started with mpirun --with-ft ulfm): a failed rank ends it. Open MPI 5 "
              "(make ulfm) with hpcrep run --elastic gives in-job recovery.", file=sys.stderr,
              flush=True)
    _warned = True
    return False


class _CommitEachEpoch(keras.callbacks.Callback):
    """Commits the state at every epoch's end (every rank: commits are local)."""

    def __init__(self, state: TensorFlowKerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.epoch = epoch + 1
        self.state.logs = {**self.state.logs, epoch: dict(logs or {})}
        self.state.commit()


class _FitState(TensorFlowKerasState):
    """The transparent ``fit``'s state: it never grows the job back (``HPCREP_ELASTIC_MAX_NP``
    is for ``@hvd.elastic.run``): a rank spawned to grow would run the script from the top, and
    the others' transparent broadcasts lie behind them."""

    def check_host_updates(self) -> None:
        """Never raise :class:`~hpcrep.errors.HostsUpdatedInterrupt`. Local."""


def fit(model: Any, attempt: Callable[[int, list], Any], initial_epoch: int) -> Any:
    """Run ``attempt(initial_epoch, extra_callbacks)`` (the patched ``fit``, sharding its input
    by the job's rank and size at the time) until it returns on every living rank; after a
    failed rank, go back to the last commit, shrink and call it again. Returns its history.

    Collective: every rank of the job calls it (the patched ``fit`` does).
    """
    state = _FitState(model, epoch=initial_epoch, logs={})
    attempts = 0
    while True:
        attempts += 1
        try:
            history = attempt(state.epoch, [_CommitEachEpoch(state)])
            recovery.confirm()
            if attempts > 1:  # the epochs of every attempt that the model kept, in one History
                epochs = sorted(state.logs)
                history.epoch = epochs
                history.history = {key: [state.logs[e].get(key) for e in epochs]
                                   for key in state.logs[epochs[-1]]} if epochs else {}
            return history
        except Exception:
            if not recovery.failed():
                raise
        state.restore()
        done = recovery.recover()
        if config.get("HPCREP_TRANSPARENT_SCALE_LR"):
            lr_scale.follow_size(getattr(model, "optimizer", None),
                                 done.new_size / done.old_size)
        state.sync()
        if comm.rank() == 0:
            print(f"hpcrep: fit goes on at epoch {state.epoch + 1} on {done.new_size} ranks "
                  f"(from the commit at the end of epoch {state.epoch}; global batch now "
                  f"{done.new_size}/{done.old_size} of what it was)", file=sys.stderr,
                  flush=True)
