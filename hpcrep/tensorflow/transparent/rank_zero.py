"""Side effects on rank 0 only: printing, ``model.save``/``save_weights`` and reading weights
files with ``load_weights``.

Saving runs without the variable-creation broadcast (rank 0 is alone), writes to a temporary
name and renames it into place (a rank killed mid-save leaves the previous complete file), and
stores the learning rate the script asked for
(:func:`hpcrep.tensorflow._keras.lr_scale.unscaled`).
On other ranks ``sys.stdout`` goes to ``/dev/null`` (errors on ``sys.stderr`` still show).
``save``/``save_weights`` write on rank 0; outside ``fit`` (where every rank calls them) the ranks
then agree on the outcome, so the file exists when any rank returns and a failed save raises on
every rank. Inside ``fit`` the saving callbacks run on rank 0 alone, so there is no exchange.

``load_weights`` outside ``fit`` reads the file on rank 0 and gives every rank rank 0's model
and optimizer state (the file need only be visible to rank 0); inside ``fit`` (a callback on
rank 0) it reads locally and the callback shares the state.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any

import keras

from hpcrep import comm
from hpcrep.checkpoint.root_io import (SUFFIXES, agree_outcome, commit, discard,
                                       temporary_beside)
from hpcrep.tensorflow import zero
from hpcrep.tensorflow._keras import lr_scale
from hpcrep.tensorflow._keras.backup_and_restore import broadcast_model_state
from hpcrep.tensorflow.transparent.patching import PatchSet, defining_class
from hpcrep.tensorflow.transparent.state import in_keras_loop, local_only


def _write_atomically(original: Any, self: Any, args: tuple, kwargs: dict) -> Any:
    """Call the saver ``original`` on a temporary file beside the target, then rename it into
    place. Paths that are not local files (``gs://``...), names Keras would refuse (so that its
    message names the user's path) and refused overwrites go straight through. Local (rank 0)."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    path = bound.arguments["filepath"]
    overwrite = bound.arguments.get("overwrite", True)
    if not isinstance(path, (str, os.PathLike)) or "://" in os.fspath(path) or not os.fspath(
            path).endswith(SUFFIXES) or (not overwrite and os.path.exists(path)):
        return original(*bound.args, **bound.kwargs)
    tmp = temporary_beside(os.fspath(path))
    bound.arguments["filepath"] = tmp
    try:
        result = original(*bound.args, **bound.kwargs)
    except BaseException:
        discard(tmp)
        raise
    commit(tmp, os.fspath(path))
    return result


def _rank_zero_writer(original: Any, what: str) -> Any:
    @functools.wraps(original)
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        def save() -> Any:
            with local_only(), lr_scale.unscaled(getattr(self, "optimizer", None)):
                return _write_atomically(original, self, args, kwargs)

        if in_keras_loop():
            return save() if comm.rank() == 0 else None
        zero.consolidate(getattr(self, "optimizer", None))  # sharded state: every rank gathers
        result, error = None, None
        if comm.rank() == 0:
            try:
                result = save()
            except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                error = exc
        agree_outcome(what, error)
        return result

    return write


def _rank_zero_reader(original: Any) -> Any:
    @functools.wraps(original)
    def load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        if in_keras_loop():  # a callback on rank 0 (BackupAndRestore): it shares the state
            with local_only():
                return original(self, *args, **kwargs)
        result, error = None, None
        if comm.rank() == 0:
            try:
                with local_only():
                    result = original(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                error = exc
        agree_outcome("model.load_weights", error)
        if comm.size() > 1:
            with local_only():  # an optimizer built here gets rank 0's values just below
                broadcast_model_state(self)
        lr_scale.rescale_after_load(getattr(self, "optimizer", None))
        return result

    return load_weights


def install(patches: PatchSet) -> None:
    """Patch printing, saving and loading. Local."""
    for name in ("save", "save_weights"):
        owner = defining_class(keras.Model, name)
        patches.attr(owner, name, _rank_zero_writer(vars(owner)[name], f"model.{name}"))
    patches.label("model.save/save_weights (rank 0 only, atomic)")
    owner = defining_class(keras.Model, "load_weights")
    patches.attr(owner, "load_weights", _rank_zero_reader(vars(owner)["load_weights"]))
    patches.label("model.load_weights (rank 0 reads, every rank gets its state)")

    if comm.rank() != 0:
        saved, devnull = sys.stdout, open(os.devnull, "w")  # noqa: SIM115 - closed on restore
        sys.stdout = devnull

        def restore_stdout() -> None:
            sys.stdout = saved
            devnull.close()

        patches.on_restore(restore_stdout)
    patches.label("printing (rank 0 only)")

