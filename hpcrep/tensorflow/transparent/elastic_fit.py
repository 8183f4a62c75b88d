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

With ``HPCREP_ELASTIC_BATCHES_PER_COMMIT=N`` (``hpcrep run --elastic --batches-per-commit N``)
a ``fit`` of array input also commits after every N batches, so that a failure loses at most N
steps instead of an epoch. Keras's own shuffle hides which rows an epoch has trained, so hpcrep
then orders the epochs itself (:mod:`.epoch_order`: a permutation from a seed the commit holds,
global batches of ranks x ``batch_size`` rows) and feeds each rank its rows; the commit holds
how many rows of the epoch are done. A ``fit`` resumed from such a commit (after a shrink, or a
relaunch on any number of ranks) first trains the rest of that epoch, as a ``fit`` of its own
(callbacks see one more ``on_train_begin``; that epoch's logs are those of its rest), then the
later epochs: every row once per epoch. ``validation_split`` is taken before ordering, as
Keras takes it. Datasets, generators and ``steps_per_epoch`` keep commits at epoch ends (rank 0
says so).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Optional

import keras
import numpy as np

from hpcrep import comm, config
from hpcrep.comm import grow, recovery
from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow._keras.elastic import TensorFlowKerasState
from hpcrep.tensorflow.transparent.epoch_order import EpochOrder, OrderedRows
from hpcrep.tensorflow.transparent.sharding import count_rows, kind_of
from hpcrep.tensorflow.variables import broadcast_object

_warned = False
_warned_batches = False


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
    every = config.get("HPCREP_ELASTIC_BATCHES_PER_COMMIT")
    when = (f"every {every} batches of array input and at every epoch's end" if every > 0
            else "at every epoch's end")
    if recovery.enabled():
        return f"fit goes on after a failed rank (ULFM; commits {when})"
    return (f"fit commits {when} to HPCREP_ELASTIC_DIR (a failed rank ends the job; a relaunch "
            "resumes from the commit)")


def arrays_to_order(x: Any, y: Any, sample_weight: Any, arguments: dict
                    ) -> Optional["ArraysToOrder"]:
    """Return the input of a ``fit`` (``arguments``: its bound arguments) whose epochs hpcrep
    orders itself so as to commit between batches: where ``HPCREP_ELASTIC_BATCHES_PER_COMMIT``
    asks for it, the input is arrays and ``steps_per_epoch`` is not set. Otherwise None: the
    commits stay at epoch ends, which rank 0 says once where the setting asked for more.
    Local (the settings and the input are the same on every rank)."""
    global _warned_batches
    if config.get("HPCREP_ELASTIC_BATCHES_PER_COMMIT") <= 0:
        return None
    why = None
    if kind_of(x) != "arrays":
        why = f"its input is a {kind_of(x)}, not arrays"
    elif arguments.get("steps_per_epoch"):
        why = "it was given steps_per_epoch"
    elif y is None and sample_weight is not None:
        why = "it has sample_weight without y"
    if why is None:
        return ArraysToOrder((x, y, sample_weight), arguments.get("batch_size") or 32,
                             arguments.get("shuffle", True) is not False,
                             arguments.get("epochs", 1))
    if not _warned_batches and comm.rank() == 0:
        print(f"hpcrep: HPCREP_ELASTIC_BATCHES_PER_COMMIT: this fit commits at epoch ends only: "
              f"{why} (commits between batches need the rows in an order hpcrep sets: array "
              "input, without steps_per_epoch)", file=sys.stderr, flush=True)
    _warned_batches = True
    return None


class _CommitEachEpoch(keras.callbacks.Callback):
    """Commits the state at every epoch's end and, following ``data`` (:class:`OrderedRows`),
    after every ``every`` steps within an epoch (not after its last: its end commits). Every
    rank alike: the commits are collective where they go to disk or can grow the job."""

    def __init__(self, state: TensorFlowKerasState, data: Optional[OrderedRows] = None,
                 every: int = 0) -> None:
        super().__init__()
        self.state, self.data, self.every = state, data, every
        self._committed_at = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._committed_at = 0

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if self.data is None or not self.every:
            return
        steps = batch + 1  # steps_per_execution > 1 reports the last of its steps
        if steps // self.every > self._committed_at // self.every and \
                steps < self.data.num_batches:
            # a resumed epoch's rest is a fit of its own: start_row is its first epoch's
            self.state.rows = self.data.order.rows_after(self.data.start_row, steps)
            self.state.commit()
            self._committed_at = steps

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.epoch, self.state.rows = epoch + 1, 0
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
    """Set ``state``'s epoch, logs, rows and seed from the commit a previous run wrote to
    ``HPCREP_ELASTIC_DIR`` (rank 0 reads it and broadcasts them); return True if there was one.
    Collective with ``HPCREP_ELASTIC_DIR``; local and False without."""
    if not config.get("HPCREP_ELASTIC_DIR"):
        return False
    snapshot = state.committed() if comm.rank() == 0 else None
    attrs = broadcast_object(None if snapshot is None else snapshot["attrs"], 0)
    if attrs is None:
        return False
    state.epoch, state.logs = attrs["epoch"], attrs["logs"]
    state.rows, state.seed = attrs.get("rows", 0), attrs.get("seed", state.seed)
    if comm.rank() == 0:
        print(f"hpcrep: fit resumes on {comm.size()} ranks from the commit {_where(state)} in "
              f"{config.get('HPCREP_ELASTIC_DIR')}", file=sys.stderr, flush=True)
    return True


def _where(state: _FitState) -> str:
    """Where ``state``'s commit lies, in words (epochs counted from 1)."""
    if state.rows:
        return f"after row {state.rows} of epoch {state.epoch + 1}"
    return f"at the end of epoch {state.epoch}"


@dataclasses.dataclass
class ArraysToOrder:
    """A ``fit``'s array input whose epochs hpcrep orders itself, to commit between batches
    (:mod:`.epoch_order`): ``arrays`` is ``(x, y, sample_weight)``, each whole (not sharded),
    ``epochs`` the ``fit``'s ``epochs``."""

    arrays: tuple
    batch_size: int
    shuffle: bool
    epochs: int

    def data(self, state: _FitState, start_row: int) -> OrderedRows:
        """This rank's rows from ``state.epoch`` on: the rest of it after ``start_row`` rows
        (that epoch alone), or every epoch to the end. Local."""
        order = EpochOrder(count_rows(self.arrays[0]), self.batch_size, comm.size(), state.seed,
                           self.shuffle)
        last = state.epoch + 1 if start_row else max(self.epochs, state.epoch)
        return OrderedRows(self.arrays, order, comm.rank(), state.epoch, last, start_row)


def _attempt(attempt: Callable[..., Any], state: _FitState, first: list,
             arrays: Optional[ArraysToOrder]) -> Any:
    """Call ``attempt`` (once; with ordered arrays, first for what remains of an epoch the
    commit lies in, then for the later epochs) with the callbacks that commit ``state``.
    Returns the last call's History. Collective."""
    if arrays is None:
        return attempt(state.epoch, [*first, _CommitEachEpoch(state)])
    every = config.get("HPCREP_ELASTIC_BATCHES_PER_COMMIT")
    history = None
    if state.rows:  # the rest of the commit's epoch: a fit of its own (it has fewer steps)
        data = arrays.data(state, state.rows)
        if data.num_batches:
            history = attempt(state.epoch, [*first, _CommitEachEpoch(state, data, every)],
                              data=data, epochs=state.epoch + 1)
            first = []
        else:  # a relaunch on more ranks than rows were left: they are dropped
            if comm.rank() == 0:
                print(f"hpcrep: the {data.order.rows - state.rows} rows left of epoch "
                      f"{state.epoch + 1} are fewer than the {comm.size()} ranks: they are "
                      "dropped (as the rows that do not fill every rank at an epoch's end "
                      "always are); that epoch logs nothing", file=sys.stderr, flush=True)
            state.epoch, state.rows = state.epoch + 1, 0
    if state.epoch < arrays.epochs or history is None:
        data = arrays.data(state, 0)
        history = attempt(state.epoch, [*first, _CommitEachEpoch(state, data, every)],
                          data=data)
    return history


def fit(model: Any, attempt: Callable[..., Any], initial_epoch: int,
        one_batch: Callable[[], Optional[tuple]] = lambda: None,
        arrays: Optional[ArraysToOrder] = None) -> Any:
    """Run ``attempt(initial_epoch, extra_callbacks)`` (the patched ``fit``, sharding its input
    by the job's rank and size at the time) until it returns on every living rank; after a
    failed rank, go back to the last commit, shrink and call it again. Returns its history.
    A commit on disk from an earlier run is resumed from first (``one_batch``: a data batch of
    the input, to build an unbuilt model before its variables are restored).

    With ``arrays`` (``HPCREP_ELASTIC_BATCHES_PER_COMMIT`` and array input) hpcrep orders the
    epochs (:mod:`.epoch_order`) and commits between batches too: ``attempt`` is then called
    with ``data=`` this rank's :class:`OrderedRows` to train on instead of its sharded input
    (its ``dataset``, ``num_batches`` steps an epoch), and ``epochs=`` where it must stop
    early (the rest of an epoch whose start was trained before the commit runs as a ``fit`` of
    its own).

    Collective: every rank of the job calls it (the patched ``fit`` does).
    """
    seed = 0
    if arrays is not None and arrays.shuffle:
        seed = broadcast_object(int(np.random.randint(2**31 - 1)) if comm.rank() == 0 else None,
                                0)  # the order of the epochs; numpy's seed makes it repeatable
    state = _FitState(model, epoch=initial_epoch, logs={}, rows=0, seed=seed)
    resumed = _resume_point(state)
    attempts = 0
    while True:
        attempts += 1
        first = [_ResumeAtTrainBegin(state, one_batch)] if resumed and attempts == 1 else []
        try:
            history = _attempt(attempt, state, first, arrays)
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
            print(f"hpcrep: fit goes on {_going_on(state)} on {done.new_size} ranks (from the "
                  f"commit {_where(state)}; global batch now {done.new_size}/{done.old_size} of "
                  "what it was)", file=sys.stderr, flush=True)


def _going_on(state: _FitState) -> str:
    if state.rows:
        return f"in epoch {state.epoch + 1}"
    return f"at epoch {state.epoch + 1}"
