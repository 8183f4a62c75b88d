"""Keras's ``BackupAndRestore`` for data-parallel training (``hvd.callbacks.BackupAndRestore``).

Same arguments and the same files as ``keras.callbacks.BackupAndRestore`` (``latest.weights.h5``
with the model's and the optimizer's variables, ``training_metadata.json`` with the epoch), so a
backup written by one can be restored by the other. What changes, on every rank:

- restore: rank 0 reads the backup (falling back to the ``.bkp`` copy as Keras does), then every
  rank gets rank 0's model and optimizer state and the epoch to resume from. The backup directory
  need only be visible to rank 0, and the ranks may be more or fewer than when it was written.
- save: rank 0 writes each file to a temporary name and renames it into place (a kill leaves the
  previous complete backup); the epoch is also stored inside the weights file, which is renamed
  first, so a kill between the two renames cannot pair new weights with an old epoch.
- a failure on rank 0 raises on every rank; ``delete_checkpoint`` removes the directory on rank 0.

Transparent mode replaces each ``keras.callbacks.BackupAndRestore`` given to ``fit`` with this
class. Every hook is collective: every rank must run ``fit`` with the callback.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from typing import Any, Optional

import h5py
import keras

from hpcrep import comm
from hpcrep.checkpoint.root_io import agree_outcome, commit, discard, temporary_beside
from hpcrep.tensorflow import zero
from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow.variables import broadcast_variables

_EPOCH_ATTR = "hpcrep_training_metadata"


@functools.lru_cache(maxsize=None)
def _combined(ours: type, theirs: type) -> type:
    """A class that is both hpcrep's ``ours`` and the user's subclass ``theirs``."""
    return type(f"Distributed{theirs.__name__}", (ours, theirs), {"__module__": theirs.__module__})


def broadcast_model_state(model: Any, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s model variables and, if its optimizer is built there,
    the optimizer's variables (building the optimizer on ranks where it is not); a sharded
    optimizer's state that ``root_rank`` loaded from a file goes to every rank's slice.

    Collective: every rank must call this, with the same architecture.
    """
    optimizer = getattr(model, "optimizer", None)
    built = optimizer is not None and optimizer.built
    if comm.size() > 1:
        built = bool(comm.broadcast_object(built, root_rank))
    variables = list(model.variables)
    if built:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
    broadcast_variables(variables, root_rank)
    if built:
        zero.share_loaded_state(optimizer, root_rank)  # sharded state rank 0 read from a file


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore`` whose backup rank 0 writes atomically and restores
    for every rank. Arguments as Keras's (``backup_dir``, ``save_freq``, ``double_checkpoint``,
    ``delete_checkpoint``).

    A run resumes at the start of the epoch after the last backup, with that backup's weights
    and optimizer state; with ``save_freq`` in batches it resumes at the start of the epoch
    with the mid-epoch state (as Keras does).

    Collective: every rank must run ``fit`` with this callback.
    """

    @classmethod
    def from_keras(cls, callback: keras.callbacks.BackupAndRestore) -> "BackupAndRestore":
        """Return a copy of Keras's ``callback`` (same directory and settings) of this class.

        A user's subclass keeps its own hooks: the copy's class derives from this class and
        from the subclass, so its ``on_train_begin`` runs (on rank 0) inside this one's.
        """
        kind = type(callback)
        if issubclass(kind, cls):
            return callback
        if kind is not keras.callbacks.BackupAndRestore:
            kind = _combined(cls, kind)
        else:
            kind = cls
        copy = kind.__new__(kind)
        copy.__dict__.update(callback.__dict__)
        return copy

    # ----- restore ---------------------------------------------------------------------------
    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        """Collective: rank 0 restores the backup, then every rank gets its state."""
        epoch, error = None, None
        if comm.rank() == 0:
            try:
                super().on_train_begin(logs)
                epoch = self._restored_epoch()
            except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                error = exc
        agree_outcome(f"restoring the backup in {self.backup_dir}", error)
        if comm.size() > 1:
            broadcast_model_state(self.model)
            epoch = comm.broadcast_object(epoch, 0)
        lr_scale.rescale_after_load(getattr(self.model, "optimizer", None))
        if epoch is not None:
            self.model._initial_epoch = epoch

    def _restored_epoch(self) -> Optional[int]:
        """The epoch to resume from (rank 0): the weights file's own record when present."""
        if not os.path.exists(self._weights_path):
            return getattr(self.model, "_initial_epoch", None)
        with h5py.File(self._weights_path, "r") as f:
            stored = f.attrs.get(_EPOCH_ATTR)
        if stored is None:  # written by Keras itself: trust its metadata file
            return getattr(self.model, "_initial_epoch", None)
        return int(json.loads(stored)["epoch"])

    # ----- save ------------------------------------------------------------------------------
    def _save_model(self) -> None:
        """Collective: rank 0 writes the backup atomically; a failure raises on every rank."""
        zero.consolidate(getattr(self.model, "optimizer", None))  # sharded state: gathered
        error = None
        if comm.rank() == 0:
            try:
                self._write_backup()
            except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                error = exc
        agree_outcome(f"writing the backup in {self.backup_dir}", error)

    def _write_backup(self) -> None:
        os.makedirs(self.backup_dir, exist_ok=True)
        if self.double_checkpoint:
            for src, dst in ((self._weights_path, self._prev_weights_path),
                             (self._training_metadata_path, self._prev_training_metadata_path)):
                if os.path.exists(src):
                    tmp = temporary_beside(dst)
                    shutil.copyfile(src, tmp)
                    commit(tmp, dst)
        metadata = json.dumps({"epoch": self._current_epoch, "batch": self._last_batch_seen})
        weights_tmp = temporary_beside(self._weights_path)
        meta_tmp = temporary_beside(self._training_metadata_path)
        try:
            self.model.save_weights(weights_tmp, overwrite=True)
            with h5py.File(weights_tmp, "a") as f:
                f.attrs[_EPOCH_ATTR] = metadata
            with open(meta_tmp, "w") as f:
                f.write(metadata)
        except BaseException:
            discard(weights_tmp)
            discard(meta_tmp)
            raise
        commit(weights_tmp, self._weights_path)
        commit(meta_tmp, self._training_metadata_path)

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        """Rank 0 deletes the backup directory if ``delete_checkpoint``. Local."""
        if comm.rank() == 0:
            super().on_train_end(logs)
