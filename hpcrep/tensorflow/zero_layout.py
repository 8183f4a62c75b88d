"""Where sharded optimizer state lives: the flat vector, this rank's slice, and the full layout.

Two pieces of bookkeeping for :mod:`hpcrep.tensorflow.zero`, both decided the same way on every
rank from what every rank knows (the trainable variables' shapes, in the order the optimizer was
built on them, and the number of ranks):

- :class:`FlatLayout`: the trainable variables flattened one after another into one vector of
  ``total`` elements, padded to ``size * shard`` and cut into ``size`` equal slices of ``shard``
  elements; rank r owns elements ``[r * shard, (r + 1) * shard)`` (the padding, at most
  ``size - 1`` elements, sits at the end of the last slices and is never read back).
- :func:`full_layout`: the order and meaning of the variables the *unsharded* optimizer would
  hold (``optimizer.variables`` of a plain ``Adam``: iterations, learning rate, then
  ``momentum``/``velocity`` of each model variable, interleaved as Keras creates them). It is
  found by building a throwaway copy of the optimizer whose ``add_variable_from_reference``
  records each slot instead of allocating it, so it follows whatever order Keras uses. A
  sharded optimizer's checkpoint is written in this layout, so it restores with or without
  sharding and at any number of ranks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

from hpcrep.errors import ShardedStateError


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """The flat vector of the trainable variables and this rank's slice of it.

    Attributes:
        shapes: each variable's shape, in the optimizer's build order.
        size: number of ranks sharing the state.
        rank: this rank (0 <= rank < size).
    """

    shapes: tuple[tuple[int, ...], ...]
    size: int
    rank: int

    @functools.cached_property
    def counts(self) -> tuple[int, ...]:
        """Number of elements of each variable."""
        return tuple(int(_prod(s)) for s in self.shapes)

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        """Where each variable starts in the flat vector."""
        out, at = [], 0
        for c in self.counts:
            out.append(at)
            at += c
        return tuple(out)

    @property
    def total(self) -> int:
        """Elements of all variables together (without padding)."""
        return sum(self.counts)

    @property
    def shard(self) -> int:
        """Elements per rank: ``ceil(total / size)`` (at least 1)."""
        return max(1, -(-self.total // self.size))

    @property
    def padded(self) -> int:
        """Length of the padded flat vector, ``size * shard``."""
        return self.size * self.shard

    @property
    def start(self) -> int:
        """First flat element this rank owns."""
        return self.rank * self.shard

    @property
    def stop(self) -> int:
        """One past the last flat element this rank owns (may lie in the padding)."""
        return self.start + self.shard

    def pieces(self) -> list[tuple[int, int, int]]:
        """Return ``(variable index, first, last)`` for each variable this rank's slice overlaps:
        elements ``first:last`` of that variable, flattened, in flat order."""
        out = []
        for i, (offset, count) in enumerate(zip(self.offsets, self.counts)):
            lo, hi = max(self.start, offset), min(self.stop, offset + count)
            if lo < hi:
                out.append((i, lo - offset, hi - offset))
        return out

    @property
    def padding(self) -> int:
        """Padding elements at the end of this rank's slice."""
        return self.stop - max(self.start, min(self.stop, self.total))


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclasses.dataclass(frozen=True)
class Entry:
    """One variable of the unsharded optimizer's ``variables``, in order.

    ``kind`` is ``"own"`` (the ``index``-th variable its constructor creates: iterations, the
    learning rate), ``"extra"`` (the ``index``-th variable its ``build`` creates that belongs to
    no model variable: Nadam's ``u_product``) or ``"slot"`` (the slot ``name`` of model variable
    ``index``: Adam's ``momentum`` and ``velocity``).
    """

    kind: str
    index: int
    name: str = ""


class _RecordingMixin:
    """In front of an optimizer class: record slots instead of creating them (full_layout)."""

    def add_variable_from_reference(self, reference_variable: Any, name: Optional[str] = None,
                                    initializer: Any = "zeros") -> None:
        index = self._hpcrep_positions[id(reference_variable)]
        self._hpcrep_slots.append((len(self._variables), Entry("slot", index, name or "var")))
        return None

    def add_variable(self, shape: Any = (), *args: Any, **kwargs: Any) -> Any:
        if tuple(shape or ()) != ():
            raise ShardedStateError(
                f"{type(self).__name__}.build creates a state variable of shape {tuple(shape)} "
                "that is not a per-element slot of one model variable; its state cannot be "
                "sharded. Use shard_optimizer_state=False with this optimizer.")
        return super().add_variable(shape, *args, **kwargs)


@functools.lru_cache(maxsize=None)
def _recording_class(base: type) -> type:
    return type(base.__name__, (_RecordingMixin, base), {})


def full_layout(kind: type, config: dict, variables: Sequence[Any]) -> list[Entry]:
    """Return the entries of the ``variables`` a plain optimizer of class ``kind`` made from
    ``config`` and built on ``variables`` would hold, in that order. Allocates only scalars.
    Local.

    Raises:
        ShardedStateError: the optimizer's build creates state that is not per-element.
    """
    probe = _recording_class(kind).from_config(dict(config))
    object.__setattr__(probe, "_hpcrep_positions", {id(v): i for i, v in enumerate(variables)})
    object.__setattr__(probe, "_hpcrep_slots", [])
    initial = len(probe.variables)
    probe.build(list(variables))
    tracked = len(probe.variables)
    pending = list(probe._hpcrep_slots)  # (tracked variables before it, entry), in order
    out: list[Entry] = []
    for j in range(tracked + 1):
        while pending and pending[0][0] == j:
            out.append(pending.pop(0)[1])
        if j < tracked:
            out.append(Entry("own", j) if j < initial else Entry("extra", j - initial))
    return out
