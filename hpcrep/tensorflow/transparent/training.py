"""``Model.fit``, ``evaluate`` and ``predict`` under transparent mode.

``fit``: inputs (training and validation) sharded with equal step counts
(:mod:`.sharding`); progress bar only on rank 0; the callback list becomes
:func:`distributed_callbacks`: rank 0's weights and optimizer state broadcast at the start, epoch
logs averaged across ranks before any user callback reads them, file-writing callbacks kept on
rank 0 only. ``evaluate`` (and ``fit``'s validation) shares its input among the ranks, every
row once, uneven shares allowed, and sums the ranks' metric states before computing the result
(:mod:`.metric_states`): every rank gets the one-process result. ``predict`` shards
and returns the full predictions, in input order, on every rank, also when some rank's share is
empty (:mod:`.predict_share`). ``fit`` refuses training input with fewer rows than ranks
(:class:`~hpcrep.errors.TransparentModeError` on every rank). A ``tf.data`` dataset marked as this
rank's shard already (``auto_shard_policy`` OFF, as ``hpcrep.tensorflow.hdf5_dataset`` returns) is
used whole: ``fit`` and ``evaluate`` check that every rank has as many batches, ``predict`` returns
this rank's predictions only (:mod:`.sharding`). With ``HPCREP_CHECKPOINT_DIR``
set, each ``fit`` of the script resumes from its own newest good checkpoint there (keyed to the
call's ordinal and the model: :mod:`hpcrep.tensorflow._keras.fit_key`) and saves every epoch; a
``fit`` whose checkpoint has done all its epochs trains nothing, says so, and returns the saved
History. (``compile`` is :mod:`.xla`'s.)

Each patched call runs inside :func:`.state.keras_loop`; calls that Keras makes from there pass
straight through, except ``fit``'s validation ``evaluate``, whose metric states are summed.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any, Optional

import keras
import numpy as np
from keras.src.trainers.data_adapters.array_slicing import train_validation_split

from hpcrep import comm, config
from hpcrep.tensorflow._keras.backup_and_restore import BackupAndRestore
from hpcrep.tensorflow._keras.callbacks import (BroadcastGlobalVariablesCallback,
                                                MetricAverageCallback, TimelineCallback)
from hpcrep.tensorflow._keras.checkpoint_callback import callback_from_settings
from hpcrep.tensorflow._keras.communication_board import CommunicationTensorBoard
from hpcrep.tensorflow.replica_check import watch_model
from hpcrep.tensorflow.transparent import elastic_fit, even_steps, metric_states, sharding
from hpcrep.tensorflow.transparent.patching import PatchSet, bind, defining_class
from hpcrep.tensorflow.transparent.metric_states import combining
from hpcrep.tensorflow.transparent.predict_share import PredictShare, drop, shard_for_predict
from hpcrep.tensorflow.transparent.state import (in_keras_loop, keras_loop, validating,
                                                  validation_share)

# Callbacks that write files or summaries: they run on rank 0 only. (Keras's BackupAndRestore is
# not among them: fit replaces it by hpcrep's, which runs on every rank.)
ROOT_ONLY_CALLBACKS: tuple[type, ...] = (keras.callbacks.ModelCheckpoint,
                                         keras.callbacks.TensorBoard, keras.callbacks.CSVLogger,
                                         keras.callbacks.ProgbarLogger)

def _distributed(callback: Any) -> Any:
    """Keras's ``BackupAndRestore`` (or a subclass) becomes hpcrep's (same files, every rank);
    other callbacks stay as given."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        return BackupAndRestore.from_keras(callback)
    return callback


def distributed_callbacks(callbacks: Any, checkpoint: Optional[keras.callbacks.Callback] = None
                          ) -> list:
    """Return the callback list ``fit`` runs on this rank.

    Order matters: the broadcast runs before anything trains, the averaging before any user
    callback reads the logs. Every rank decides the same list apart from the rank-0-only writers.
    ``keras.callbacks.BackupAndRestore`` runs on every rank as
    hpcrep's ``hvd.callbacks.BackupAndRestore`` (rank 0 reads and writes, every rank gets the
    restored state and epoch). ``checkpoint`` (HPCREP_CHECKPOINT_DIR's
    :class:`CheckpointCallback`) runs on every rank: its saves and signal handling are collective.
    """
    user = list(callbacks) if isinstance(callbacks, (list, tuple)) else (
        [] if callbacks is None else [callbacks])
    user = [_distributed(cb) for cb in user]
    kept = user if comm.rank() == 0 else [cb for cb in user
                                          if not isinstance(cb, ROOT_ONLY_CALLBACKS)]
    return [BroadcastGlobalVariablesCallback(root_rank=0), MetricAverageCallback(),
            _timeline_callback(user), *kept, *([checkpoint] if checkpoint is not None else [])]


def _timeline_callback(user: list) -> keras.callbacks.Callback:
    """Return what marks ``fit``'s steps in the timeline: with ``HPCREP_TENSORBOARD`` (a
    directory, or ``auto``: the script's ``keras.callbacks.TensorBoard``'s ``log_dir``), the
    callback that also writes the communication figures for TensorBoard. Every rank decides
    alike (the setting is the same everywhere; ``auto`` looks at the callbacks every rank was
    given)."""
    board = config.get("HPCREP_TENSORBOARD").strip()
    if board.lower() == "auto":
        board = next((os.fspath(cb.log_dir) for cb in user
                      if isinstance(cb, keras.callbacks.TensorBoard)), "")
    return CommunicationTensorBoard(board) if board else TimelineCallback()


def _quiet_off_root(arguments: dict) -> None:
    if comm.rank() != 0:
        arguments["verbose"] = 0


def _evaluation_share(data: Any, rank: int, size: int) -> Optional[PredictShare]:
    """This rank's share of ``fit``'s ``validation_data`` (every row once across the ranks)."""
    if data is None:
        return None
    if isinstance(data, (tuple, list)) and sharding.kind_of(data[0]) == "arrays":
        return shard_for_predict(data[0], rank, size, list(data[1:]))
    if sharding.kind_of(data) == "presharded":
        return PredictShare(sharding.check_presharded(data, equal=True), "presharded")
    return shard_for_predict(data, rank, size)


def _validation_input(share: Optional[PredictShare]) -> Any:
    if share is None:
        return None
    return (share.x, *share.others) if share.kind == "arrays" else share.x


class _BatchSizes(keras.callbacks.Callback):
    """Record the number of rows of each predicted batch."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def on_predict_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        leaf = keras.tree.flatten((logs or {}).get("outputs"))[0]
        self.sizes.append(int(np.shape(leaf)[0]))


def install(patches: PatchSet) -> None:
    """Patch ``fit``, ``evaluate`` and ``predict`` of ``keras.Model``. Local. Each call reads the
    job's rank and size when it runs (they change when an elastic job shrinks)."""
    fit_owner = defining_class(keras.Model, "fit")
    original_fit = vars(fit_owner)["fit"]
    original_evaluate = vars(defining_class(keras.Model, "evaluate"))["evaluate"]
    original_predict = vars(defining_class(keras.Model, "predict"))["predict"]
    fits = itertools.count(1)  # the script's top-level fit calls, in order (same on every rank)

    @functools.wraps(original_fit)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if in_keras_loop():
            return original_fit(self, *args, **kwargs)
        bound = bind(original_fit, self, args, kwargs)
        a = bound.arguments
        given = {k: a[k] for k in ("x", "y", "sample_weight", "validation_data", "callbacks")}
        checkpoint = callback_from_settings(next(fits))
        if checkpoint is not None and self.built:
            # Restoring before fit lets fit skip the epochs already done; an unbuilt model is
            # restored by the callback at train begin (weights only, epochs counted afresh).
            a["initial_epoch"] = max(a["initial_epoch"], checkpoint.restore(self))
            if checkpoint.restored is not None and checkpoint.restored.epoch >= a["epochs"]:
                return checkpoint.finished(self, a["epochs"])  # the same on every rank
        if getattr(self, "optimizer", None) is not None:
            watch_model(self.optimizer, self)  # the canary reports its non-trainable state too

        elastic, arrays, total_epochs = elastic_fit.requested(), None, a["epochs"]
        if a["validation_split"] and sharding.kind_of(given["x"]) == "arrays":
            if given["validation_data"] is None:  # as Keras would: the last rows of the whole
                # input, unshuffled (not of each rank's share), before the rest is sharded
                (given["x"], given["y"], given["sample_weight"]), \
                    given["validation_data"] = train_validation_split(
                        (given["x"], given["y"], given["sample_weight"]), a["validation_split"])
            a["validation_split"] = 0.0
        if elastic:
            arrays = elastic_fit.arrays_to_order(given["x"], given["y"], given["sample_weight"],
                                                 a)

        validation: list[Optional[PredictShare]] = [None]  # this attempt's share, for evaluate

        def attempt(initial_epoch: int, extra: list, data: Any = None,
                    epochs: Optional[int] = None) -> Any:
            """One ``fit`` over the input sharded by the job's rank and size now, or over
            ``data`` (this rank's rows, ordered by :mod:`.elastic_fit`), to ``epochs``."""
            r, n = comm.rank(), comm.size()
            if data is None:
                a["x"], (a["y"], a["sample_weight"]), kind = sharding.shard_input(
                    given["x"], [given["y"], given["sample_weight"]], r, n, equal=True)
                if kind == "arrays" and n > 1:
                    a["x"], a["y"], a["sample_weight"] = even_steps.equal_steps(
                        a["x"], a["y"], a["sample_weight"], sharding.count_rows(given["x"]), r,
                        n, a["batch_size"] or 32, can_weight=a["class_weight"] is None)
            else:
                a["x"], a["y"], a["sample_weight"] = data.dataset, None, None
                a["validation_batch_size"] = (a["validation_batch_size"]
                                              or data.order.batch_size)  # as Keras defaults it
                a["batch_size"], a["shuffle"] = None, False
                a["steps_per_epoch"] = data.num_batches
            validation[0] = _evaluation_share(given["validation_data"], r, n)
            a["validation_data"] = _validation_input(validation[0])
            a["callbacks"] = distributed_callbacks(given["callbacks"], checkpoint) + extra
            a["initial_epoch"] = initial_epoch
            a["epochs"] = total_epochs if epochs is None else epochs
            _quiet_off_root(a)
            with keras_loop(), validating(validation[0]):
                return original_fit(*bound.args, **bound.kwargs)

        if elastic:
            return elastic_fit.fit(self, attempt, a["initial_epoch"], lambda: sharding.first_rows(
                given["x"], given["y"], given["sample_weight"]), arrays)
        return attempt(a["initial_epoch"], [])

    @functools.wraps(original_evaluate)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if in_keras_loop():
            share = validation_share() if kwargs.get("_use_cached_eval_dataset") else None
            if share is None:  # not fit's validation: Keras's own call, as it is
                return original_evaluate(self, *args, **kwargs)
            with combining(lambda: share.stand_in):
                return original_evaluate(self, *args, **kwargs)
        bound = bind(original_evaluate, self, args, kwargs)
        a = bound.arguments
        rank, size = comm.rank(), comm.size()
        if sharding.kind_of(a["x"]) == "presharded":
            share = PredictShare(sharding.check_presharded(a["x"], equal=True), "presharded",
                                 others=[a["y"], a["sample_weight"]])
        else:
            share = shard_for_predict(a["x"], rank, size, [a["y"], a["sample_weight"]])
        a["x"] = share.x
        if share.kind == "arrays":
            a["y"], a["sample_weight"] = share.others
        if comm.rank() != 0 and isinstance(a["callbacks"], (list, tuple)):
            a["callbacks"] = [cb for cb in a["callbacks"]
                              if not isinstance(cb, ROOT_ONLY_CALLBACKS)]
        _quiet_off_root(a)
        with keras_loop(), combining(lambda: share.stand_in):
            return original_evaluate(*bound.args, **bound.kwargs)

    @functools.wraps(original_predict)
    def predict(self: Any, *args: Any, **kwargs: Any) -> Any:
        rank, size = comm.rank(), comm.size()
        if in_keras_loop() or size == 1:
            return original_predict(self, *args, **kwargs)
        bound = bind(original_predict, self, args, kwargs)
        a = bound.arguments
        share = shard_for_predict(a["x"], rank, size)
        a["x"] = share.x
        sizes = _BatchSizes()
        user = a["callbacks"]
        user = list(user) if isinstance(user, (list, tuple)) else ([] if user is None else [user])
        a["callbacks"] = [*user, sizes]
        _quiet_off_root(a)
        with keras_loop():
            outputs = original_predict(*bound.args, **bound.kwargs)
        if share.kind == "presharded":  # this rank's own data: its predictions are its own
            return outputs
        if share.stand_in:  # this rank's share was empty: it contributes no rows
            outputs, sizes.sizes = drop(outputs), []
        return sharding.gather_predictions(outputs,
                                           None if share.kind == "arrays" else sizes.sizes)

    metric_states.install(patches)
    patches.attr(fit_owner, "fit", fit)
    patches.attr(defining_class(keras.Model, "evaluate"), "evaluate", evaluate)
    patches.attr(defining_class(keras.Model, "predict"), "predict", predict)
    patches.label("fit/evaluate/predict (inputs sharded; fit: equal steps)")
    patches.label("evaluate and validation metrics (states summed across ranks), "
                  "epoch logs (averaged), callbacks writing files (rank 0 only)")
    if elastic_fit.requested():
        patches.label(elastic_fit.describe())
