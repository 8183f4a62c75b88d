"""Checkpoint a Keras model with :mod:`hpcrep.checkpoint`: state helpers and a Keras callback.

``training_state(model, optimizer)`` returns what a checkpoint holds (model variables, optimizer
variables, RNG state of Python, numpy and TensorFlow's global generator) as numpy arrays;
``load_training_state(ckpt, model, optimizer)`` puts it back. Custom loops use these with a
:class:`hpcrep.checkpoint.CheckpointManager`; ``model.fit`` users add :class:`CheckpointCallback`.
"""

from __future__ import annotations

import logging
import signal as _signal
import sys
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.checkpoint import (Checkpoint, CheckpointManager, PreemptionSignal, host_rng_state,
                               requeue, set_host_rng_state, slurm_job_id)
from hpcrep.errors import CheckpointError
from hpcrep.tensorflow import sharded_variables, zero
from hpcrep.tensorflow._keras import epoch_logs, lr_scale
from hpcrep.tensorflow._keras.fit_key import fit_key
from hpcrep.tensorflow.optimizer import accumulation_variables
from hpcrep.tensorflow.powersgd import rank_local_variables

log = logging.getLogger("hpcrep.checkpoint")


def tf_rng_state() -> dict[str, np.ndarray]:
    """Return the state of TensorFlow's global ``tf.random.Generator`` as arrays.

    Empty when op determinism is on and no global generator was set (then none is in use).
    """
    try:
        gen = tf.random.get_global_generator()
    except RuntimeError:
        return {}
    return {"tf_global_state": gen.state.numpy(), "tf_global_algorithm": np.array(gen.algorithm)}


def set_tf_rng_state(state: dict[str, np.ndarray]) -> None:
    """Restore what :func:`tf_rng_state` returned."""
    if "tf_global_state" in state:
        try:
            gen = tf.random.get_global_generator()
        except RuntimeError:  # determinism on and no generator set: create the saved one
            gen = tf.random.Generator.from_state(state["tf_global_state"],
                                                 int(state["tf_global_algorithm"]))
            tf.random.set_global_generator(gen)
        gen.state.assign(state["tf_global_state"])


def _optimizer_variables(model: Any, optimizer: Any) -> list:
    """The optimizer's variables (its slots: built first if needed), or [] without one."""
    if optimizer is None:
        return []
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return list(optimizer.variables)


def training_state(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Return ``{"model": [...], "optimizer": [...], "rng": {...}}`` as numpy arrays.

    The optimizer is built first if needed, so its slots are included. A learning rate that
    transparent mode multiplied by the number of ranks is saved unscaled
    (:mod:`hpcrep.tensorflow._keras.lr_scale`). Sharded variables of tensor-parallel layers,
    and their optimizer slots, are saved whole: gathered over the replica's ranks
    (:mod:`hpcrep.tensorflow.sharded_variables`), so the state is that of the same model
    unsharded. Sharded optimizer state (``shard_optimizer_state=True``,
    :mod:`hpcrep.tensorflow.zero`) is gathered to the layout of the unsharded optimizer, so the
    checkpoint restores with or without sharding, at any number of ranks. State that differs
    between ranks by design (PowerSGD's error buffers,
    :func:`hpcrep.tensorflow.powersgd.rank_local_variables`, and the gradients summed so far
    for ``backward_passes_per_step`` with their pass counter,
    :func:`hpcrep.tensorflow.optimizer.accumulation_variables`) is gathered from every rank
    into ``"rank_local": {"<rank>": [...]}``.

    Local for a model without sharded variables, sharded optimizer state or per-rank state;
    with any of them, collective: every rank must call this, in the same order.

    Raises:
        CheckpointError: tensor-parallel layers with an optimizer that shards its state (not
            supported together yet).
    """
    variables = list(model.variables)
    slots = _optimizer_variables(model, optimizer)
    var_specs, slot_specs = sharded_variables.specs_of(variables, slots)
    _check_not_both_sharded(optimizer, var_specs)
    with lr_scale.unscaled(optimizer):
        if optimizer is not None and zero.is_sharded(optimizer):
            saved_slots = zero.state_arrays(optimizer)
        else:
            saved_slots = [sharded_variables.full_value(v, s) for v, s in zip(slots, slot_specs)]
        state = {"model": [sharded_variables.full_value(v, s)
                           for v, s in zip(variables, var_specs)],
                 "optimizer": saved_slots,
                 "rng": {**host_rng_state(), **tf_rng_state()}}
    local = _per_rank(optimizer)
    if local:
        state["rank_local"] = _gather_rank_local(local)
    return state


def _per_rank(optimizer: Any) -> list:
    """The optimizer's per-rank state, in the order checkpoints hold it. Local."""
    return rank_local_variables(optimizer) + accumulation_variables(optimizer)


def _check_not_both_sharded(optimizer: Any, var_specs: list) -> None:
    """Refuse tensor-parallel variables with ZeRO-sharded optimizer state. Local (every rank
    has the same model and optimizer)."""
    if (optimizer is not None and zero.is_sharded(optimizer)
            and any(spec is not None for spec in var_specs)):
        raise CheckpointError(
            "checkpoints of tensor-parallel layers with an optimizer that shards its state "
            "(shard_optimizer_state=True) are not supported yet; use one or the other")


def _gather_rank_local(variables: list) -> dict[str, list[np.ndarray]]:
    """Every rank's values of ``variables``, keyed by rank (``"00003"``). Collective."""
    mine = [np.array(v.numpy(), order="C") for v in variables]  # (ascontiguousarray: 0-d to 1-d)
    size = comm.size() if comm.is_initialized() else 1
    if size == 1:
        return {f"{0:05d}": mine}
    rows = [np.atleast_1d(a) for a in mine]  # scalars (a pass counter) gathered as one row
    gathered = comm.grouped_allgather(rows, name="rank_local_state")
    return {f"{r:05d}": [g[r * w.shape[0]:(r + 1) * w.shape[0]].reshape(a.shape)
                         for g, w, a in zip(gathered, rows, mine)]
            for r in range(size)}


def _restore_rank_local(ckpt: Checkpoint, optimizer: Any) -> None:
    """Give this rank its own saved per-rank state back; zero it (with a warning) when the
    checkpoint has none for this number of ranks. Local."""
    local = _per_rank(optimizer)
    if not local:
        return
    rank = comm.rank() if comm.is_initialized() else 0
    size = comm.size() if comm.is_initialized() else 1
    saved = ckpt.list(f"rank_local/{rank:05d}")
    ranks_saved = len({k.split("/")[1] for k in ckpt.arrays if k.startswith("rank_local/")})
    if ranks_saved == size and len(saved) == len(local) and all(
            tuple(v.shape) == a.shape for v, a in zip(local, saved)):
        for v, a in zip(local, saved):
            v.assign(a)
        return
    if rank == 0:
        log.warning("%s holds per-rank state (PowerSGD error buffers, gradients accumulated "
                    "for backward_passes_per_step) of %d rank(s), this run has %d: it restarts "
                    "from zero", ckpt.path, ranks_saved, size)
    for v in local:
        v.assign(tf.zeros_like(v))


def load_training_state(ckpt: Checkpoint, model: Any, optimizer: Any = None) -> None:
    """Assign a checkpoint's model and optimizer variables and RNG state, and this rank's own
    per-rank state (zeroed if the checkpoint has none for this number of ranks: PowerSGD's
    error buffers restart, and so does an accumulation of ``backward_passes_per_step``). Local.

    A sharded variable (and its optimizer slots) takes this rank's slice of the whole variable
    the checkpoint holds, whatever the number of shards it was saved with.

    Raises:
        CheckpointError: the checkpoint's variables do not match the model's or optimizer's
            (count or shapes); the message names the first mismatch.
    """
    variables = list(model.variables)
    slots = _optimizer_variables(model, optimizer)
    var_specs, slot_specs = sharded_variables.specs_of(variables, slots)
    _check_not_both_sharded(optimizer, var_specs)
    zero_state = optimizer is not None and zero.is_sharded(optimizer)
    pairs = [("model", variables, var_specs)]
    if optimizer is not None and not zero_state:
        pairs.append(("optimizer", slots, slot_specs))
    for group, variables, specs in pairs:
        saved = ckpt.list(group)
        if len(saved) != len(variables):
            raise CheckpointError(
                f"{ckpt.path} holds {len(saved)} {group} variables, this {group} has "
                f"{len(variables)}; restore into the same architecture/optimizer it was saved from")
        for i, (v, a, spec) in enumerate(zip(variables, saved, specs)):
            expected = tuple(v.shape) if spec is None else spec.full_shape(v.shape)
            if expected != a.shape:
                sharded = "" if spec is None else " (whole; this rank holds a slice)"
                raise CheckpointError(f"{ckpt.path}: {group} variable {i} ({v.path}) has shape "
                                      f"{expected}{sharded}, the checkpoint has {a.shape}")
    if zero_state:
        shapes, saved = zero.state_shapes(optimizer), ckpt.list("optimizer")
        if len(saved) != len(shapes):
            raise CheckpointError(
                f"{ckpt.path} holds {len(saved)} optimizer variables, this optimizer has "
                f"{len(shapes)}; restore into the same architecture/optimizer it was saved from")
        for i, (shape, a) in enumerate(zip(shapes, saved)):
            if shape != a.shape:
                raise CheckpointError(f"{ckpt.path}: optimizer variable {i} "
                                      f"({optimizer.name}[{i}]) has shape {shape}, the "
                                      f"checkpoint has {a.shape}")
    for group, variables, specs in pairs:
        for v, a, spec in zip(variables, ckpt.list(group), specs):
            v.assign(sharded_variables.slice_of(a, spec, str(v.path)))
    if zero_state:
        zero.assign_state(optimizer, ckpt.list("optimizer"))
    lr_scale.rescale_after_load(optimizer)
    _restore_rank_local(ckpt, optimizer)
    rng = ckpt.group("rng")
    if rng:
        set_host_rng_state(rng)
        set_tf_rng_state(rng)


class CheckpointCallback(keras.callbacks.Callback):
    """Save every ``save_every_epochs`` epochs; on a pre-timeout signal save, stop, and requeue.

    Construct it from just a directory. To skip the epochs already done, restore before ``fit``::

        ckpt = CheckpointCallback("/scratch/run1")
        model.fit(x, y, epochs=10, initial_epoch=ckpt.restore(model), callbacks=[ckpt])

    If ``restore`` was not called, ``on_train_begin`` restores weights and optimizer state (but
    ``fit`` then counts epochs from its own ``initial_epoch``). A checkpoint taken mid-epoch on
    a signal resumes at the start of that epoch with the mid-epoch weights.

    Files are named by the training steps run (``ckpt-<steps>.h5``), applied or skipped: a
    ``LossScaleOptimizer`` that skips a step on inf/NaN gradients does not advance
    ``optimizer.iterations``, which is saved as the ``iterations`` attribute instead. Every save
    gets a larger name than the one before and than the checkpoint it resumed from (whose name
    is where the count continues; a checkpoint of an older hpcrep, named by iterations,
    resumes the same way), so a restore always finds the newest.

    Args:
        directory: checkpoint directory (see :class:`hpcrep.checkpoint.CheckpointManager`).
        keep: checkpoints to keep; default ``HPCREP_CHECKPOINT_KEEP``.
        save_every_epochs: save after every this many epochs (0: only on signal and at the end).
        signum: the pre-timeout signal to watch (default SIGUSR1; None to watch none).
        requeue_on_signal: after the signal's checkpoint, ``scontrol requeue`` the job when
            running under Slurm.
        fit_ordinal: key the files to this ``fit`` of the script (the N-th, 1 for the first) and
            its model (:mod:`hpcrep.tensorflow._keras.fit_key`): they are named
            ``ckpt-fit<N>-<fingerprint>-<steps>.h5`` and only those are restored; other files in
            the directory are left alone. None (default): ``ckpt-<steps>.h5``.

    Every save also stores the averaged logs of the epochs done so far (``epoch_logs``, JSON), so
    that a rerun of a finished ``fit`` can return its History (:meth:`history`).

    Every hook is collective: every rank must run ``fit`` with this callback.
    """

    def __init__(self, directory: str, keep: Optional[int] = None, save_every_epochs: int = 1,
                 signum: Optional[int] = _signal.SIGUSR1, requeue_on_signal: bool = True,
                 fit_ordinal: Optional[int] = None) -> None:
        super().__init__()
        self.manager = CheckpointManager(directory, keep or config.get("HPCREP_CHECKPOINT_KEEP"))
        self.fit_ordinal = fit_ordinal
        self.key: Optional[str] = None  # fit<N>-<fingerprint>, once the model is known
        self.epoch_logs: dict[int, dict[str, float]] = {}  # epoch -> its averaged logs
        self.save_every_epochs = int(save_every_epochs)
        self.signum = signum
        self.requeue_on_signal = requeue_on_signal
        self.restored: Optional[Checkpoint] = None
        self.preempted = False
        self._did_restore = False
        self._signal: Optional[PreemptionSignal] = None
        self._epoch = 0
        self._steps = 0  # training steps run, applied or skipped: the next save's name
        self._epoch_start = 0  # self._steps when the current epoch began
        self._last_saved = -1  # the name of the last save (or of the restored checkpoint)

    def restore(self, model: Any = None) -> int:
        """Load the newest good checkpoint into ``model`` (default: the callback's model).

        Returns the number of epochs already completed: pass it as ``fit(initial_epoch=...)``.
        Collective: every rank must call this.
        """
        model = model if model is not None else self.model
        self._did_restore = True
        self._bind_key(model)
        self.restored = self.manager.restore()
        if self.restored is None:
            return 0
        load_training_state(self.restored, model, getattr(model, "optimizer", None))
        self.epoch_logs = epoch_logs.read(self.restored)
        self._steps = self._last_saved = self.restored.step
        if _rank() == 0:
            log.warning("resumed from %s (epoch %d, step %d)", self.restored.path,
                        self.restored.epoch, self.restored.step)
        return self.restored.epoch

    def save(self, epoch: int, **metadata: Any) -> str:
        """Save the model's state now as having completed ``epoch`` epochs, under a name larger
        than any this callback saved or restored before. Collective."""
        optimizer = getattr(self.model, "optimizer", None)
        self._bind_key(self.model)
        iterations = _iterations(optimizer)
        step = max(self._steps, iterations, self._last_saved + 1)
        if self.key is not None:
            metadata["fit_key"] = self.key
        path = self.manager.save(training_state(self.model, optimizer), step=step, epoch=epoch,
                                 iterations=iterations,
                                 epoch_logs=epoch_logs.dumps(self.epoch_logs, epoch), **metadata)
        self._last_saved = step
        return path

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if not self._did_restore:
            self.restore(self.model)
        # A model trained before this callback saw it: at least the steps its optimizer applied.
        self._steps = max(self._steps, _iterations(getattr(self.model, "optimizer", None)))
        if self.signum is not None:
            self._signal = PreemptionSignal(self.signum)

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch = epoch
        self._epoch_start = self._steps

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        # ``batch`` is the epoch's last step run (with steps_per_execution, the last of several).
        self._steps = self._epoch_start + batch + 1
        if self._signal is None or not self._signal.agreed():
            return
        self.save(self._epoch, batch=batch + 1, preempted=1)
        self.preempted = True
        self.model.stop_training = True
        if self.requeue_on_signal and slurm_job_id() and comm.rank() == 0:
            requeue()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self.preempted:
            return
        self.epoch_logs[epoch] = epoch_logs.plain(logs)
        if self.save_every_epochs and (epoch + 1) % self.save_every_epochs == 0:
            self.save(epoch + 1)

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        if self._signal is not None:
            self._signal.close()
            self._signal = None

    def history(self, model: Any, epochs: int) -> keras.callbacks.History:
        """Return a Keras History of the logged epochs before ``epochs`` (restored or run), and
        make it ``model.history``. Local."""
        return epoch_logs.history(model, self.epoch_logs, epochs)

    def finished(self, model: Any, epochs: int) -> keras.callbacks.History:
        """Say on rank 0's stderr that the restored checkpoint has done all ``epochs``, and
        return the History of its logged epochs (:meth:`history`). Local."""
        if _rank() == 0:
            which = f"fit {self.fit_ordinal}" if self.fit_ordinal is not None else "fit"
            print(f"{which} already finished its {epochs} epochs in the checkpoint of "
                  f"{self.manager.directory}: nothing to train; delete it or set "
                  "HPCREP_CHECKPOINT_DIR elsewhere to train again", file=sys.stderr, flush=True)
        return self.history(model, epochs)

    def _bind_key(self, model: Any) -> None:
        """Key the files to this fit and ``model``, once (files of other keys are not seen)."""
        if self.fit_ordinal is None or self.key is not None:
            return
        self.key = fit_key(self.fit_ordinal, model, getattr(model, "optimizer", None))
        self.manager = CheckpointManager(self.manager.directory, self.manager.keep,
                                         prefix=f"{self.manager.prefix}-{self.key}")


def _rank() -> int:
    """This rank (0 when hpcrep runs without MPI, as a single process may)."""
    return comm.rank() if comm.is_initialized() else 0


def _iterations(optimizer: Any) -> int:
    """The optimizer's applied steps (a LossScaleOptimizer's: its inner one's), 0 without one."""
    return int(optimizer.iterations.numpy()) if optimizer is not None else 0


def callback_from_settings(fit_ordinal: int) -> Optional[CheckpointCallback]:
    """Return a :class:`CheckpointCallback` on ``HPCREP_CHECKPOINT_DIR`` keyed to the script's
    ``fit_ordinal``-th ``fit``, or None if the setting is unset.

    Transparent mode adds it to every ``fit``, so an unchanged script saves each epoch and every
    ``fit`` resumes from its own newest good checkpoint when rerun. Local (constructing talks to
    no one).
    """
    directory = config.get("HPCREP_CHECKPOINT_DIR")
    return CheckpointCallback(directory, fit_ordinal=fit_ordinal) if directory else None
