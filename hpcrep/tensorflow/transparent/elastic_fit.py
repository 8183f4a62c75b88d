"""Transparent ``fit`` that goes on after a failed rank (``python -m hpcrep --elastic``, ULFM),
resumes from a commit on disk, and grows back through a relaunch (``hpcrep run --elastic``).

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

With ``HPCREP_ELASTIC_DIR`` (``hpcrep run --elastic`` sets it) every commit also goes to disk
(rank 0, :meth:`hpcrep.tensorflow.elastic.State.commit`), with or without ULFM, and a ``fit``
that finds a commit there from an earlier run of the script resumes from it: its epoch and
History before the first epoch, the variables at train begin (after ``fit`` built them). That is
how ``hpcrep run --elastic`` relaunches a transparent job without ULFM, and how one with ULFM
grows back (``hpcrep run --max-np``, which sets ``HPCREP_ELASTIC_RELAUNCH``): at an epoch's
commit where :func:`hpcrep.comm.grow.planned` finds free slots or a lost host answering again,
every rank stops (:func:`hpcrep.comm.grow.stop_to_relaunch`) and ``hpcrep run`` starts the
script again on up to ``--max-np`` ranks, from that commit. (A rank spawned into the running job
would run the script from the top, and the others' transparent broadcasts lie behind them.)
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import keras

from hpcrep import comm, config
from hpcrep.comm import grow, recovery
from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow._keras.elastic import TensorFlowKerasState
from hpcrep.tensorflow.variables import broadcast_object

_warned = False


def requested() -> bool:
    """Return True if ``HPCREP_TRANSPARENT_ELASTIC`` asks for it and the job can use it: it can
    outlive a rank (ULFM), or its commits go to ``HPCREP_ELASTIC_DIR`` for a relaunch. Warns
    once (rank 0) where neither holds. Local."""
    global _warned
    if not config.get("HPCREP_TRANSPARENT_ELASTIC"):
        return False
    if recovery.enabled() or config.get("HPCREP_ELASTIC_DIR"):
        return True
    if not _warned and comm.rank() == 0:
        print("hpcrep: --elastic: this job cannot outlive a rank (its MPI has no ULFM, or it was "
              "not started with mpirun --with-ft ulfm): a failed rank ends it. Open MPI 5 "
              "(make ulfm) with hpcrep run --elastic gives in-job recovery; hpcrep run "
              "--elastic on any MPI relaunches it from its last epoch.", file=sys.stderr,
              flush=True)
    _warned = True
    return False


def describe() -> str:
    """One line for the start-up report: what the elastic ``fit`` does in this job. Local."""
    if recovery.enabled():
        return "fit goes on after a failed rank (ULFM; commits at every epoch's end)"
    return ("fit commits at every epoch's end to HPCREP_ELASTIC_DIR (a failed rank ends the job; "
            "a relaunch resumes from the commit)")


class _CommitEachEpoch(keras.callbacks.Callback):
    """Commits the state at every epoch's end (every rank: commits are local)."""

    def __init__(self, state: TensorFlowKerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.epoch = epoch + 1
        self.state.logs = {**self.state.logs, epoch: dict(logs or {})}
        self.state.commit()


class _ResumeAtTrainBegin(keras.callbacks.Callback):
    """Gives every rank the variables of the commit on disk at train begin (the state's first
    ``sync``: rank 0 loads the file, then broadcasts). A model that Keras would build only in
    its first step (no ``Input``, never called) is built first, symbolically, from
    ``one_batch()`` (a data batch of the input, or None where none can be read). Collective."""

    def __init__(self, state: TensorFlowKerasState,
                 one_batch: Callable[[], Optional[tuple]]) -> None:
        super().__init__()
        self.state = state
        self.one_batch = one_batch

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        model = self.state.model
        if not all(layer.built for layer in model._flatten_layers()):
            batch = self.one_batch()
            if batch is not None:
                model._symbolic_build(data_batch=batch)  # what fit does under a strategy
        self.state.sync()


class _FitState(TensorFlowKerasState):
    """The transparent ``fit``'s state. It never grows the job in place (a rank spawned to grow
    would run the script from the top, and the others' transparent broadcasts lie behind them);
    under ``hpcrep run --elastic --max-np`` it grows through a relaunch instead."""

    def _snapshot(self) -> dict:
        """What :meth:`commit` writes to disk: the learning rates as the script set them
        (:func:`hpcrep.tensorflow._keras.lr_scale.unscaled_values`), for a relaunch scales them
        once more for its own number of ranks. The commit in memory keeps them scaled. Local."""
        values = lr_scale.unscaled_values(self.optimizer, self.variables(), self._values)
        return {**super()._snapshot(), "values": values}

    def check_host_updates(self) -> None:
        """Where ``hpcrep run`` relaunches (``HPCREP_ELASTIC_RELAUNCH``) and the job can grow
        (:func:`hpcrep.comm.grow.planned`: free slots, or a lost host back), stop every rank
        at this commit for the relaunch (``SystemExit(0)``). Collective when it can grow."""
        if not config.get("HPCREP_ELASTIC_RELAUNCH"):
            return
        plan = grow.planned()
        if plan is not None:
            grow.stop_to_relaunch(plan)


def _resume_point(state: _FitState) -> bool:
    """Set ``state``'s epoch and logs from the commit a previous run wrote to
    ``HPCREP_ELASTIC_DIR`` (rank 0 reads it and broadcasts them); return True if there was one.
    Collective with ``HPCREP_ELASTIC_DIR``; local and False without."""
    if not config.get("HPCREP_ELASTIC_DIR"):
        return False
    snapshot = state.committed() if comm.rank() == 0 else None
    attrs = broadcast_object(None if snapshot is None else snapshot["attrs"], 0)
    if attrs is None:
        return False
    state.epoch, state.logs = attrs["epoch"], attrs["logs"]
    if comm.rank() == 0:
        print(f"hpcrep: fit resumes on {comm.size()} ranks from the commit at the end of epoch "
              f"{state.epoch} in {config.get('HPCREP_ELASTIC_DIR')}", file=sys.stderr,
              flush=True)
    return True


def fit(model: Any, attempt: Callable[[int, list], Any], initial_epoch: int,
        one_batch: Callable[[], Optional[tuple]] = lambda: None) -> Any:
    """Run ``attempt(initial_epoch, extra_callbacks)`` (the patched ``fit``, sharding its input
    by the job's rank and size at the time) until it returns on every living rank; after a
    failed rank, go back to the last commit, shrink and call it again. Returns its history.
    A commit on disk from an earlier run is resumed from first (``one_batch``: a data batch of
    the input, to build an unbuilt model before its variables are restored).

    Collective: every rank of the job calls it (the patched ``fit`` does).
    """
    state = _FitState(model, epoch=initial_epoch, logs={})
    resumed = _resume_point(state)
    attempts = 0
    while True:
        attempts += 1
        first = [_ResumeAtTrainBegin(state, one_batch)] if resumed and attempts == 1 else []
        try:
            history = attempt(state.epoch, [*first, _CommitEachEpoch(state)])
            recovery.confirm()
            if attempts > 1 or resumed:  # the epochs of every attempt kept, in one History
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
