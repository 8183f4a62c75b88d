"""Sharded variables: variables that hold one slice of a bigger one, spread over a replica's ranks.

A tensor-parallel layer (:mod:`hpcrep.replicator.tensor_parallel`) keeps on each rank of a
replica only its slice ``[start, stop)`` along one axis of a full variable, and records that here
with :func:`mark_sharded`. What needs the full variable asks here:

- checkpoints (:mod:`hpcrep.tensorflow._keras.checkpoint_callback`) save the full variable,
  gathered over the replica's ranks (:func:`full_value`), and restore by taking this rank's
  slice of it (:func:`slice_of`), so a checkpoint written at k shards resumes at any other k,
  plain Keras layers of the same shapes included;
- making the replicas start equal (:func:`broadcast_from_first_replica`): a sharded variable is
  broadcast only among the ranks that hold the same shard.

An optimizer's slot of a sharded variable (momentum, Adam's moments) has the variable's shape and
is sharded the same way. Keras names a slot after its variable's path
(``Optimizer.add_variable_from_reference``: ``"<path with '/' as '_'>_<slot>"``);
:func:`specs_of` recognises slots by that name and their shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from hpcrep import comm
from hpcrep.errors import CollectiveArgumentError
from hpcrep.tensorflow.variables import broadcast_variables, variable_key


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Which slice of a full variable a sharded variable holds on this rank.

    Attributes:
        axis: the axis along which the full variable is split.
        full_size: the full variable's size along ``axis``.
        start: first index of this rank's slice along ``axis``.
        stop: one past its last index.
        group: the ranks that hold the slices, in slice order (a replica's
            ``model_parallel`` communicator).
    """

    axis: int
    full_size: int
    start: int
    stop: int
    group: comm.Communicator

    def full_shape(self, local_shape: Sequence[int]) -> tuple[int, ...]:
        """The full variable's shape, from this rank's slice shape. Local."""
        shape = list(local_shape)
        shape[self.axis] = self.full_size
        return tuple(shape)


_specs: dict[Any, ShardSpec] = {}


def mark_sharded(variable: Any, spec: ShardSpec) -> None:
    """Record that ``variable`` holds ``spec``'s slice of a full variable. Local."""
    _specs[variable_key(variable)] = spec


def shard_spec(variable: Any) -> Optional[ShardSpec]:
    """Return ``variable``'s :class:`ShardSpec`, or None for a whole (replicated) one. Local."""
    try:
        return _specs.get(variable_key(variable))
    except TypeError:  # not a variable (no key)
        return None


def specs_of(variables: Sequence[Any], slots: Sequence[Any] = ()) -> tuple[list, list]:
    """Return the specs of ``variables`` and of the optimizer variables ``slots`` (None: whole).

    A slot takes the spec of the sharded variable it was made from: the one whose Keras path,
    with '/' as '_', followed by '_' starts the slot's name (the longest such), if the shapes
    agree. Local.
    """
    var_specs = [shard_spec(v) for v in variables]
    prefixes = sorted(((str(getattr(v, "path", "")).replace("/", "_") + "_", tuple(v.shape), s)
                       for v, s in zip(variables, var_specs) if s is not None and
                       getattr(v, "path", None)), key=lambda p: -len(p[0]))
    slot_specs = []
    for slot in slots:
        spec = shard_spec(slot)
        name = str(getattr(slot, "name", ""))
        for prefix, shape, candidate in prefixes if spec is None else ():
            if name.startswith(prefix) and tuple(slot.shape) == shape:
                spec = candidate
                break
        slot_specs.append(spec)
    return var_specs, slot_specs


def full_value(value: Any, spec: Optional[ShardSpec]) -> np.ndarray:
    """Return the full variable whose slice ``value`` is (numpy); ``value`` itself if whole.

    Collective over ``spec.group``: every rank holding a slice must call this, in the same
    order, for the same variables.
    """
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if spec is None or spec.group.size() == 1:
        return array
    moved = np.ascontiguousarray(np.moveaxis(array, spec.axis, 0))
    gathered, _ = comm.allgatherv(moved, "sharded_variable.gather", spec.group)
    return np.ascontiguousarray(np.moveaxis(gathered, 0, spec.axis))


def slice_of(full: np.ndarray, spec: Optional[ShardSpec], what: str) -> np.ndarray:
    """Return this rank's slice of ``full`` (``full`` itself for a whole variable). Local.

    Raises:
        CollectiveArgumentError: ``full`` is too short along the spec's axis.
    """
    if spec is None:
        return full
    if full.ndim <= spec.axis or full.shape[spec.axis] != spec.full_size:
        raise CollectiveArgumentError(
            f"{what}: expected a full variable of size {spec.full_size} along axis {spec.axis} "
            f"to take rows {spec.start}..{spec.stop - 1} from, got shape {full.shape}; restore "
            "into the architecture that was saved")
    index = [slice(None)] * full.ndim
    index[spec.axis] = slice(spec.start, spec.stop)
    return np.ascontiguousarray(full[tuple(index)])


def broadcast_from_first_replica(variables: Sequence[Any],
                                 data_parallel: Optional[comm.Communicator] = None,
                                 parent: Optional[comm.Communicator] = None) -> None:
    """Give ``variables`` replica 0's values on every rank.

    Whole variables take job rank ``parent.ranks[0]``'s values over ``parent`` (default: the
    job); sharded ones take, over ``data_parallel`` (the ranks with this rank's shard index),
    the values of its first rank, which holds the same shard in replica 0.

    Collective: every rank of ``parent`` must call this, in the same order, with the same
    variables (the same ones sharded everywhere).
    """
    parent = comm.communicator() if parent is None else parent
    variables = list(variables)
    sharded = [v for v in variables if shard_spec(v) is not None]
    whole = [v for v in variables if shard_spec(v) is None]
    broadcast_variables(whole, root_rank=parent.ranks[0], process_set=parent)
    if sharded:
        if data_parallel is None:
            raise CollectiveArgumentError(
                "broadcasting sharded variables needs the data-parallel communicator (the ranks "
                "with this rank's shard index): pass mesh.data_parallel")
        broadcast_variables(sharded, root_rank=data_parallel.ranks[0],
                            process_set=data_parallel)



def parameter_bytes(variables: Sequence[Any]) -> dict[str, int]:
    """Return the bytes of ``variables`` on this rank: ``sharded`` (the slices it holds),
    ``whole`` (the replicated ones), ``held`` (their sum) and ``unsharded`` (what the same
    variables take with one rank per replica). Local."""
    out = {"sharded": 0, "whole": 0, "unsharded": 0}
    for v in variables:
        itemsize = np.dtype(v.dtype.as_numpy_dtype if hasattr(v.dtype, "as_numpy_dtype")
                            else v.dtype).itemsize
        local = int(np.prod(v.shape)) * itemsize
        spec = shard_spec(v)
        out["sharded" if spec is not None else "whole"] += local
        out["unsharded"] += (local if spec is None
                             else int(np.prod(spec.full_shape(v.shape))) * itemsize)
    out["held"] = out["sharded"] + out["whole"]
    return out
