"""The elastic states and ``run``, without Keras: :class:`State`, :class:`ObjectState`,
:class:`TensorFlowState`. Keras's state and callbacks are in
:mod:`hpcrep.tensorflow._keras.elastic`; the public face, with what elastic mode does and does not
do, is :mod:`hpcrep.tensorflow.elastic`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
from typing import Any, Callable, Iterable, Optional

import numpy as np

from hpcrep import comm, config
from hpcrep.checkpoint import commit_file, private_dir, root_io
from hpcrep.comm import grow, recovery
from hpcrep.errors import CheckpointFormatError, HostsUpdatedInterrupt, UntrustedFileError
from hpcrep.tensorflow.variables import broadcast_object, broadcast_variables

_state_ids = itertools.count()  # states are numbered in creation order, the same in every run
_OLD_SUFFIX = ".pkl"  # the pickled commits of earlier versions: refused, never loaded


class State:
    """Base of the elastic states: ``commit``/``restore``/``sync`` and reset callbacks."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._state_id = next(_state_ids)
        self._resume_checked = False
        self._read_from_disk: Optional[dict] = None  # committed()'s result, for the resume

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Register functions to call when the job's membership changes (after a shrink or a
        growth under ``@hvd.elastic.run``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Call the reset callbacks (Horovod calls this after membership changes). Local."""
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod compatibility: hosts never change under hpcrep."""

    def commit(self) -> None:
        """Snapshot the state (what ``restore`` returns to); with ``HPCREP_ELASTIC_DIR`` rank 0
        also writes it to disk (:mod:`hpcrep.checkpoint.commit_file`: arrays and plain
        attributes, never pickled; the file replaced atomically; a directory hpcrep creates is
        0700), and no rank returns before the file is in place, so a rank that fails after its
        commit can never leave an older commit behind.

        Collective with ``HPCREP_ELASTIC_DIR`` (every rank must call it, as Horovod's commit,
        which checks for host updates with the other ranks); local without.

        Raises:
            NotPlainDataError: on rank 0 (:class:`~hpcrep.errors.RemoteError` on the others),
                with ``HPCREP_ELASTIC_DIR``, if an attribute is not plain data.
        """
        self.save()
        directory = config.get("HPCREP_ELASTIC_DIR")
        if directory:
            error = None
            if comm.rank() == 0:
                try:
                    private_dir.make(directory)
                    snapshot = self._snapshot()
                    commit_file.write(self._path(directory), snapshot.get("values", []),
                                      snapshot["attrs"])
                except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised
                    error = exc
            root_io.agree_outcome(f"writing the elastic commit to {directory}", error)
        self.check_host_updates()

    def committed(self) -> Optional[dict]:
        """Return what a previous run's last :meth:`commit` of this state wrote to
        ``HPCREP_ELASTIC_DIR`` (a dict: ``attrs``, and ``values`` for variables), or None if
        nothing was. Local (the file is rank 0's; other ranks may not see it). The first sync
        resumes from what this returned, without reading the file again.

        Raises (before anything in the file is read):
            CheckpointFormatError: the directory holds this state's commit in the old pickle
                format (``elastic-state-<id>.pkl``), which hpcrep no longer loads.
            UntrustedFileError: the commit or its directory can be written by other users, or
                belongs to another user (:func:`hpcrep.checkpoint.private_dir.check_trusted`).
            CheckpointCorruptError: the commit is truncated or not of hpcrep's format.
        """
        directory = config.get("HPCREP_ELASTIC_DIR")
        if not directory:
            return None
        path, old = self._path(directory), self._path(directory, _OLD_SUFFIX)
        if os.path.lexists(old):
            raise CheckpointFormatError(
                f"hpcrep: {old} is an elastic commit in the old pickle format, which hpcrep no "
                "longer loads (loading a pickle runs whatever code it holds, and anyone who "
                f"could write {directory} could have put it there). Expected "
                f"{os.path.basename(path)} (arrays and plain data, never pickled). Delete "
                f"{old} (its run starts afresh), or set HPCREP_ELASTIC_DIR to another directory.")
        if not os.path.lexists(path):
            return None
        private_dir.check_trusted(path, "elastic commit", UntrustedFileError,
                                  "set HPCREP_ELASTIC_DIR to a private directory (hpcrep "
                                  "creates a missing one with mode 0700)")
        self._read_from_disk = commit_file.read(path)
        return self._read_from_disk

    def _resume_from_disk(self) -> None:
        """On the first sync, load the last commit written by a previous run into rank 0."""
        if self._resume_checked:
            return
        self._resume_checked = True
        snapshot = None
        if comm.rank() == 0:
            snapshot = self._read_from_disk or self.committed()
            self._read_from_disk = None
        if snapshot is not None:
            self._load_snapshot(snapshot)
            self._check_resumed(self._path(config.get("HPCREP_ELASTIC_DIR")))
            self.restore()

    def _check_resumed(self, path: str) -> None:
        """Raise ValueError if the snapshot just loaded from ``path`` does not fit this state.
        Local."""

    def _path(self, directory: str, suffix: str = commit_file.SUFFIX) -> str:
        return os.path.join(directory, f"elastic-state-{self._state_id}{suffix}")

    def _snapshot(self) -> dict:
        raise NotImplementedError

    def _load_snapshot(self, snapshot: dict) -> None:
        raise NotImplementedError

    def check_host_updates(self) -> None:
        """Raise :class:`~hpcrep.errors.HostsUpdatedInterrupt` on every rank if the job can grow
        back now (ULFM, ``HPCREP_ELASTIC_MAX_NP``: :func:`hpcrep.comm.grow.planned`);
        ``@hvd.elastic.run`` then adds the ranks. :meth:`commit` calls it.

        Collective while the job is below ``HPCREP_ELASTIC_MAX_NP`` (a broadcast); local and
        free otherwise.
        """
        plan = grow.planned()
        if plan is not None:
            raise HostsUpdatedInterrupt(plan)

    def save(self) -> None:
        """Snapshot the state in memory. Local."""
        raise NotImplementedError

    def restore(self) -> None:
        """Return the state to the last snapshot. Local."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank rank 0's state and snapshot it.

        Collective: every rank must call this.
        """
        raise NotImplementedError


class ObjectState(State):
    """Plain Python attributes (``ObjectState(epoch=0, batch=0)``) saved, restored and synced.

    Args:
        bcast_object: function broadcasting a picklable object from rank 0 (default hpcrep's).
        get_rank: accepted for Horovod compatibility.
        **kwargs: the attributes and their initial values.
    """

    def __init__(self, bcast_object: Optional[Callable[[Any], Any]] = None,
                 get_rank: Optional[Callable[[], int]] = None, **kwargs: Any) -> None:
        self._bcast_object = bcast_object or (lambda obj: broadcast_object(obj, 0))
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__()

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        """Give every rank rank 0's last snapshot of the attributes. Collective."""
        self._resume_from_disk()
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _snapshot(self) -> dict:
        return {"attrs": self._saved_state}

    def _load_snapshot(self, snapshot: dict) -> None:
        self._saved_state = snapshot["attrs"]

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


class TensorFlowState(ObjectState):
    """TensorFlow variables plus plain attributes.

    Args:
        variables: the variables to save, restore and sync.
        **kwargs: plain attributes, as for :class:`ObjectState`.
    """

    def __init__(self, variables: Optional[Iterable[Any]] = None, **kwargs: Any) -> None:
        self._fixed_variables = list(variables or [])
        self._values: list[np.ndarray] = []
        super().__init__(**kwargs)
        self._save_variables()

    def variables(self) -> list[Any]:
        """Return the variables this state covers (read each time: optimizers build lazily)."""
        return self._fixed_variables

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables(), self._values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        """Give every rank rank 0's variables and attributes, and snapshot them. Collective."""
        self._resume_from_disk()
        variables = self.variables()
        if variables:
            broadcast_variables(variables, root_rank=0)
        self._save_variables()
        super().sync()

    def _snapshot(self) -> dict:
        return {**super()._snapshot(), "values": self._values}

    def _load_snapshot(self, snapshot: dict) -> None:
        super()._load_snapshot(snapshot)
        self._values = snapshot["values"]

    def _save_variables(self) -> None:
        self._values = [np.array(v.numpy(), copy=True) for v in self.variables()]

    def _check_resumed(self, path: str) -> None:
        """Raise ValueError, naming the first difference, if the variables of the commit in
        ``path`` are not this state's (more of them, or another shape): the script changed
        since it was written. Local."""
        variables = self.variables()
        shapes = [tuple(v.shape) for v in variables]
        saved = [tuple(np.shape(value)) for value in self._values]
        if len(saved) <= len(shapes) and saved == shapes[:len(saved)]:
            return
        where = next((i for i, (a, b) in enumerate(zip(saved, shapes)) if a != b),
                     min(len(saved), len(shapes)))
        if not shapes:
            raise ValueError(
                f"hpcrep: the elastic commit {path} holds {len(saved)} variables, but the state "
                "has none yet to restore them into (a Keras model without an Input, built only "
                "by its first step from input that cannot be read ahead, such as a generator): "
                "give the model a keras.Input, or build it (model.build or one call) before "
                "fit. Or remove the commit, or set HPCREP_ELASTIC_DIR elsewhere, to start afresh.")
        raise ValueError(
            f"hpcrep: the elastic commit {path} does not fit this model: it holds "
            f"{len(saved)} variables, the state has {len(shapes)}; variable {where} is "
            f"{saved[where] if where < len(saved) else 'missing'} there and "
            f"{shapes[where] if where < len(shapes) else 'missing'} here. It was written by "
            "another model or script: remove it, or set HPCREP_ELASTIC_DIR to another "
            "directory to start afresh.")


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, ...)``: sync ``state`` from rank 0, then run ``func``; where the
    job can outlive a rank (ULFM, :mod:`hpcrep.comm.recovery`), go on after one fails.

    A failed rank makes the survivors' next collective raise (any exception while
    :func:`hpcrep.comm.recovery.failed` says so counts; TensorFlow wraps the error of an op).
    Every survivor then returns ``state`` to its last commit, the job shrinks to the survivors
    (ranks and size change; what holds the job's communicator, traced functions included, runs
    on the survivors), the reset callbacks run, ``state`` is synced from the new rank 0, and
    ``func`` is called again. After ``func`` returns, the ranks agree that none has failed
    meanwhile (else they recover and call it again). Without ULFM a failed rank ends the job
    (``hpcrep run --elastic`` relaunches it from the last commit written to
    ``HPCREP_ELASTIC_DIR``).

    With ``HPCREP_ELASTIC_MAX_NP`` (``hpcrep run --max-np``) a job that lost ranks grows back
    at a commit where slots are free again (:mod:`hpcrep.comm.grow`): ``commit`` raises
    :class:`~hpcrep.errors.HostsUpdatedInterrupt` on every rank, the new ranks are spawned (the
    same program, which must reach the decorated function without any other collective after
    ``hvd.init()``), the reset callbacks run and ``func`` is called again after a sync that gives
    the new ranks rank 0's state. A host the job lost entirely comes back through a relaunch
    instead: when ``hpcrep run`` reports it reachable again, the job stops at the next commit
    (``SystemExit(0)`` on every rank: code after the decorated call does not run) and ``hpcrep
    run`` starts it again on every host from that commit (:mod:`hpcrep.comm.hosts_back`).

    Collective: every rank must call the decorated function.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        while True:
            state.sync()
            try:
                result = func(state, *args, **kwargs)
                recovery.confirm()
                return result
            except HostsUpdatedInterrupt as interrupt:
                if interrupt.plan.healed:  # a lost host is back: hpcrep run relaunches the job
                    grow.stop_to_relaunch(interrupt.plan)
                grow.grow(interrupt.plan)  # the state is the commit that raised it
                state.on_reset()
                continue
            except Exception:
                if not recovery.failed():
                    raise
            state.restore()
            recovery.recover()
            state.on_reset()

    return wrapper


__all__ = ["State", "ObjectState", "TensorFlowState", "run"]
