"""The two regimes of a :class:`~hpcrep.replicator.Replicator`: synchronous and sync groups.

Synchronous (the default): every replica steps in lockstep; primitives and ``wrap_optimizer``
span all replicas.

Asynchronous, as TF-Replicator's sync groups: the ranks are split into ``num_groups`` contiguous
groups (:mod:`hpcrep.comm.groups`), each an :class:`hpcrep.comm.Communicator`. ``Replicator.run``
and ``reduce`` run inside ``hpcrep.comm.using(group)``, so every primitive, the optimizer from
``wrap_optimizer`` and any ``hvd.*`` collective called by ``step_fn`` is synchronous within the
group only; TensorFlow's collectives bind the group when the step is traced, so a compiled step
keeps it. Outside those calls collectives span the job, and ``hvd.rank()``/``hvd.size()`` always
describe the job (``ReplicaContext.replica_id``/``num_replicas`` describe the group).

The groups share their parameters through a parameter store on one rank
(:func:`hpcrep.comm.param_store.open_store`: an MPI window with passive-target locks, or where
this MPI has no one-sided window over the ranks, a thread on the store rank answering
point-to-point requests; ``HPCREP_PARAM_STORE`` chooses). Every
``exchange_every`` steps the group's first rank atomically adds the group's *delta* (how far its
trainable variables moved since its previous exchange, times ``delta_scale``) to the store and
takes back the store's value, then broadcasts it within the group, whose replicas adopt it.
Nobody waits for another group: a slow group's deltas arrive late (stale, as in Downpour SGD)
but never stall a fast group.

``delta_scale`` trades speed for safety. The default, ``1/num_groups``, moves the store by the
groups' average progress: model averaging when groups run at equal rates, and never an
overshoot, however rare the exchanges. ``1.0`` counts every group's delta in full (Downpour,
TF-Replicator's asynchronous updates): fastest with an exchange every step, but with rare
exchanges the groups' deltas add up (measured: two groups each converged on a linear
regression over 200 steps, exchanging only at the end, summed to a model as bad as the start).

The exchange runs in the step as a ``tf.cond`` on a step counter variable, so it happens eagerly
and inside ``tf.function`` alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from hpcrep.comm import collectives as host_collectives
from hpcrep.comm import groups
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.param_store import open_store
from hpcrep.errors import ReplicatorError
from hpcrep.tensorflow.bridge import host_call


@dataclasses.dataclass(frozen=True)
class Synchronous:
    """Every replica steps in lockstep (the default regime)."""


@dataclasses.dataclass(frozen=True)
class SyncGroups:
    """Asynchronous regime: synchronous within each of ``num_groups`` groups, asynchronous across.

    Attributes:
        num_groups: number of sync groups (between 1 and the number of ranks).
        exchange_every: steps between two parameter exchanges of a group (>= 1).
        delta_scale: factor applied to a group's parameter delta before it joins the store;
            None (default) means ``1 / num_groups``.
        store_rank: rank that hosts the parameter store.
    """

    num_groups: int = 2
    exchange_every: int = 1
    delta_scale: Optional[float] = None
    store_rank: int = 0

    def __post_init__(self) -> None:
        if int(self.exchange_every) < 1:
            raise ReplicatorError(f"exchange_every must be >= 1, got {self.exchange_every}")
        if self.delta_scale is not None and not (np.isfinite(self.delta_scale)
                                                 and self.delta_scale > 0):
            raise ReplicatorError(f"delta_scale must be a positive number or None, got "
                                  f"{self.delta_scale}")

    @property
    def scale(self) -> float:
        """The factor actually applied to deltas (``delta_scale`` or ``1 / num_groups``)."""
        return 1.0 / self.num_groups if self.delta_scale is None else float(self.delta_scale)


def as_regime(regime: Any) -> Any:
    """Return a regime object for ``"sync"``, ``"async"`` (two groups) or a regime instance."""
    if regime is None or regime == "sync":
        return Synchronous()
    if regime == "async":
        return SyncGroups()
    if isinstance(regime, (Synchronous, SyncGroups)):
        return regime
    raise ReplicatorError(
        f"unknown regime {regime!r}: expected 'sync', 'async', hpcrep.replicator.Synchronous() "
        "or hpcrep.replicator.SyncGroups(num_groups=..., exchange_every=...)")


class GroupRuntime:
    """The state of the asynchronous regime on one rank: group communicator, store, step counter.

    Created by the Replicator (collective over every rank); :meth:`close` undoes it.
    """

    def __init__(self, config: SyncGroups) -> None:
        self.config = config
        self.layout = groups.split(config.num_groups)
        self.store: Optional[Any] = None  # ParamStore or P2PParamStore
        self.variables: list[Any] = []
        self.steps: Optional[tf.Variable] = None
        self._anchor: Optional[np.ndarray] = None
        self.initial: Optional[np.ndarray] = None   # the store's first value (flat float64)
        self.pushed: Optional[np.ndarray] = None    # sum of the deltas this rank pushed
        self._reported = 0
        self.group_steps = np.zeros(config.num_groups, np.int64)
        self.exchanges = 0
        self.max_divergence = 0

    @property
    def group(self) -> Communicator:
        """This rank's sync group."""
        return self.layout.group

    # -- parameter store ---------------------------------------------------------------------

    def attach(self, variables: Sequence[Any]) -> None:
        """Create the store from ``variables`` (already equal on every rank).

        Collective: every rank of every group must call this, in the same order.
        """
        if self.store is not None:
            raise ReplicatorError(
                "the asynchronous regime exchanges the trainable variables of one scope(); "
                "this Replicator already has them. Create every trainable variable inside a "
                "single `with replicator.scope():` block.")
        self.variables = [v for v in variables if v.dtype.is_floating and v.trainable]
        flat = self._flatten([np.asarray(v.numpy()) for v in self.variables])
        self._anchor, self.initial, self.pushed = flat.copy(), flat.copy(), np.zeros_like(flat)
        self.store = open_store(self.layout.parent.comm, flat.size, self.config.num_groups, flat,
                                host=self.config.store_rank)
        with tf.init_scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="hpcrep_replicator_steps")

    def _flatten(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        if not arrays:
            return np.zeros(0, np.float64)
        return np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in arrays])

    def _exchange_host(self, step: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
        """Leader: push delta, pull store; then broadcast within the group. Collective in group."""
        n = self.store.num_params
        payload = np.zeros(n + self.config.num_groups, np.float64)
        if self.layout.group_rank == 0:
            flat = self._flatten(arrays)
            delta = (flat - self._anchor) * self.config.scale
            steps_now = int(step)
            params, counts = self.store.exchange(delta, self.layout.group_id,
                                                 steps_now - self._reported)
            self.pushed += delta
            self._reported = steps_now
            self._anchor = params.copy()
            payload[:n], payload[n:] = params, counts
        payload = host_collectives.broadcast(payload, self.group.ranks[0],
                                             name="replicator.exchange", communicator=self.group)
        self._note(payload[n:].astype(np.int64))
        out, offset = [], 0
        for a in arrays:
            out.append(payload[offset:offset + a.size].reshape(a.shape).astype(a.dtype))
            offset += a.size
        return out

    def _note(self, counts: np.ndarray) -> None:
        self.group_steps = counts.copy()
        self.exchanges += 1
        self.max_divergence = max(self.max_divergence, int(counts.max() - counts.min()))

    def exchange(self) -> tf.Tensor:
        """Graph-compatible: exchange with the store now and assign the result. Group-collective."""
        variables = self.variables
        values = host_call(self._exchange_host, [self.steps.read_value()] +
                           [v.read_value() for v in variables],
                           [v.dtype for v in variables], [v.shape for v in variables],
                           name="hpcrep_replicator_exchange")
        return tf.group(*[v.assign(x) for v, x in zip(variables, values)])

    def after_step(self) -> Any:
        """Count a step and exchange every ``exchange_every`` steps (eager or in a tf.function).

        Collective within the group: every replica of the group must call this once a step.
        """
        if self.store is None:
            raise ReplicatorError(
                "the asynchronous regime has no parameters to exchange: create the model's "
                "variables inside `with replicator.scope():` before calling run()")
        step = self.steps.assign_add(1)

        def do_exchange() -> tf.Tensor:
            with tf.control_dependencies([self.exchange()]):
                return tf.constant(True)

        return tf.cond(tf.equal(step % int(self.config.exchange_every), 0), do_exchange,
                       lambda: tf.constant(False))

    def join(self) -> np.ndarray:
        """Push every group's last delta, wait for all groups, then adopt the store's values.

        Returns every group's step count. Collective: every rank of every group must call this.
        """
        if self.store is None:
            return self.group_steps
        self.exchange()
        self.layout.parent.comm.Barrier()
        n = self.store.num_params
        payload = np.zeros(n + self.config.num_groups, np.float64)
        if self.layout.group_rank == 0:
            params, counts = self.store.read()
            payload[:n], payload[n:] = params, counts
            self._anchor = params.copy()
        payload = host_collectives.broadcast(payload, self.group.ranks[0], name="replicator.join",
                                             communicator=self.group)
        offset = 0
        for v in self.variables:
            size = int(np.prod(v.shape))
            v.assign(payload[offset:offset + size].reshape(v.shape).astype(v.dtype.as_numpy_dtype))
            offset += size
        self._note(payload[n:].astype(np.int64))
        return self.group_steps

    def close(self) -> None:
        """Free the store and the group communicator.

        Collective: every rank of every group must call this.
        """
        if self.store is not None:
            self.store.free()
            self.store = None
        self.group.free()
