"""Checkpoint a Keras model with :mod:`hpcrep.checkpoint`: state helpers and a Keras callback.

``training_state(model, optimizer)`` returns what a checkpoint holds (model variables, optimizer
variables, RNG state of Python, numpy and TensorFlow's global generator) as numpy arrays;
``load_training_state(ckpt, model, optimizer)`` puts it back. Custom loops use these with a
:class:`hpcrep.checkpoint.CheckpointManager`; ``model.fit`` users add :class:`CheckpointCallback`.
"""

from __future__ import annotations

import logging
import signal as _signal
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from hpcrep import comm, config
from hpcrep.checkpoint import (Checkpoint, CheckpointManager, PreemptionSignal, host_rng_state,
                               requeue, set_host_rng_state, slurm_job_id)
from hpcrep.errors import CheckpointError
from hpcrep.tensorflow import zero
from hpcrep.tensorflow._keras import lr_scale

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


def _built(model: Any, optimizer: Any) -> Any:
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    return optimizer


def training_state(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Return ``{"model": [...], "optimizer": [...], "rng": {...}}`` as numpy arrays.

    The optimizer is built first if needed, so its slots are included. A learning rate that
    transparent mode multiplied by the number of ranks is saved unscaled
    (:mod:`hpcrep.tensorflow._keras.lr_scale`). Sharded optimizer state
    (``shard_optimizer_state=True``) is gathered to the layout of the unsharded optimizer, so
    the checkpoint restores with or without sharding, at any number of ranks.

    Local; collective when the optimizer shards its state (every rank must call this, in the
    same order).
    """
    optimizer = _built(model, optimizer)
    with lr_scale.unscaled(optimizer):
        return {"model": [np.asarray(v.numpy()) for v in model.variables],
                "optimizer": [] if optimizer is None else zero.state_arrays(optimizer),
                "rng": {**host_rng_state(), **tf_rng_state()}}


def load_training_state(ckpt: Checkpoint, model: Any, optimizer: Any = None) -> None:
    """Assign a checkpoint's model and optimizer variables and RNG state. Local.

    Raises:
        CheckpointError: the checkpoint's variables do not match the model's or optimizer's
            (count or shapes); the message names the first mismatch.
    """
    optimizer = _built(model, optimizer)
    groups = [("model", [tuple(v.shape) for v in model.variables],
               [v.path for v in model.variables])]
    if optimizer is not None:
        shapes = zero.state_shapes(optimizer)
        groups.append(("optimizer", shapes, [f"{optimizer.name}[{i}]" for i in range(len(shapes))]))
    for group, shapes, labels in groups:
        saved = ckpt.list(group)
        if len(saved) != len(shapes):
            raise CheckpointError(
                f"{ckpt.path} holds {len(saved)} {group} variables, this {group} has "
                f"{len(shapes)}; restore into the same architecture/optimizer it was saved from")
        for i, (shape, label, a) in enumerate(zip(shapes, labels, saved)):
            if shape != a.shape:
                raise CheckpointError(f"{ckpt.path}: {group} variable {i} ({label}) has shape "
                                      f"{shape}, the checkpoint has {a.shape}")
    for v, a in zip(model.variables, ckpt.list("model")):
        v.assign(a)
    if optimizer is not None:
        zero.assign_state(optimizer, ckpt.list("optimizer"))
    lr_scale.rescale_after_load(optimizer)
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

    Args:
        directory: checkpoint directory (see :class:`hpcrep.checkpoint.CheckpointManager`).
        keep: checkpoints to keep; default ``HPCREP_CHECKPOINT_KEEP``.
        save_every_epochs: save after every this many epochs (0: only on signal and at the end).
        signum: the pre-timeout signal to watch (default SIGUSR1; None to watch none).
        requeue_on_signal: after the signal's checkpoint, ``scontrol requeue`` the job when
            running under Slurm.

    Every hook is collective: every rank must run ``fit`` with this callback.
    """

    def __init__(self, directory: str, keep: Optional[int] = None, save_every_epochs: int = 1,
                 signum: Optional[int] = _signal.SIGUSR1, requeue_on_signal: bool = True) -> None:
        super().__init__()
        self.manager = CheckpointManager(directory, keep or config.get("HPCREP_CHECKPOINT_KEEP"))
        self.save_every_epochs = int(save_every_epochs)
        self.signum = signum
        self.requeue_on_signal = requeue_on_signal
        self.restored: Optional[Checkpoint] = None
        self.preempted = False
        self._did_restore = False
        self._signal: Optional[PreemptionSignal] = None
        self._epoch = 0

    def restore(self, model: Any = None) -> int:
        """Load the newest good checkpoint into ``model`` (default: the callback's model).

        Returns the number of epochs already completed: pass it as ``fit(initial_epoch=...)``.
        Collective: every rank must call this.
        """
        model = model if model is not None else self.model
        self._did_restore = True
        self.restored = self.manager.restore()
        if self.restored is None:
            return 0
        load_training_state(self.restored, model, getattr(model, "optimizer", None))
        if comm.rank() == 0:
            log.warning("resumed from %s (epoch %d, step %d)", self.restored.path,
                        self.restored.epoch, self.restored.step)
        return self.restored.epoch

    def save(self, epoch: int, **metadata: Any) -> str:
        """Save the model's state now as having completed ``epoch`` epochs. Collective."""
        optimizer = getattr(self.model, "optimizer", None)
        step = int(optimizer.iterations.numpy()) if optimizer is not None else 0
        return self.manager.save(training_state(self.model, optimizer), step=step, epoch=epoch,
                                 **metadata)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if not self._did_restore:
            self.restore(self.model)
        if self.signum is not None:
            self._signal = PreemptionSignal(self.signum)

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
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
        if self.save_every_epochs and (epoch + 1) % self.save_every_epochs == 0:
            self.save(epoch + 1)

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        if self._signal is not None:
            self._signal.close()
            self._signal = None


def callback_from_settings() -> Optional[CheckpointCallback]:
    """Return a :class:`CheckpointCallback` on ``HPCREP_CHECKPOINT_DIR``, or None if it is unset.

    Transparent mode adds it to every ``fit``, so an unchanged script saves each epoch and
    resumes from the newest good checkpoint when rerun. Local (constructing talks to no one).
    """
    directory = config.get("HPCREP_CHECKPOINT_DIR")
    return CheckpointCallback(directory) if directory else None
