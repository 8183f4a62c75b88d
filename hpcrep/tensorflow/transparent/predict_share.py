"""This rank's share of a ``predict`` (or ``evaluate``) input, even when the input has fewer rows,
batches or items than there are ranks.

``predict`` cuts its input as :mod:`.sharding` does, dropping nothing, and
:func:`~.sharding.gather_predictions` puts every rank's predictions back in order. A rank whose
share is empty (``predict(np.ones((1, 3)))`` at 2 ranks) cannot simply skip Keras's predict loop,
nor run it on nothing: Keras fails on an empty input (``UnboundLocalError`` on
``batch_outputs``, Keras 3.15), and a model that is not built yet is built inside the loop, which
broadcasts each new variable from rank 0, a collective every rank must join. Such a rank predicts
a *stand-in* instead, the input's first row, batch or item, and drops what it predicted: it takes
part in every collective, and the gather learns the structure, dtypes and shapes of the
predictions it contributes none of. An input that is empty as a whole is passed on as it is, so
Keras fails on it on every rank, as it does in one process.

``evaluate`` takes the same shares (every row once, uneven shares allowed) and discards a
stand-in's metric states before the ranks sum theirs (:mod:`.metric_states`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator, Sequence

import tensorflow as tf

from hpcrep.tensorflow.transparent import sharding


@dataclasses.dataclass
class PredictShare:
    """This rank's part of a ``predict`` input (:func:`shard_for_predict`).

    Attributes:
        x: what this rank predicts.
        kind: the input's kind (:func:`.sharding.kind_of`).
        stand_in: True when this rank's share is empty and ``x`` is a stand-in (the input's
            first row, batch or item) whose predictions are to be dropped. For a generator it is
            set while Keras consumes ``x``: read it after ``predict``.
        others: the arrays cut as ``x`` is (``y``, ``sample_weight``; for arrays only, else as
            given).
    """

    x: Any
    kind: sharding.Kind
    stand_in: bool = False
    others: list = dataclasses.field(default_factory=list)


def _generator_share(gen: Any, rank: int, size: int, share: PredictShare) -> Iterator:
    """Items ``rank, rank + size, ...`` of ``gen``; if there are none, its first item, and
    ``share.stand_in`` is set."""
    iterator = iter(gen)
    group = list(itertools.islice(iterator, size))
    if rank < len(group):
        yield group[rank]
        yield from sharding.shard_generator(iterator, rank, size, equal=False)
    elif group:
        share.stand_in = True
        yield group[0]


def shard_for_predict(x: Any, rank: int, size: int, others: Sequence[Any] = ()) -> PredictShare:
    """Return this rank's share of the ``predict`` input ``x``, or a stand-in if it is empty.

    ``others`` (``y`` and ``sample_weight`` of ``evaluate``) are cut as array ``x`` is.

    Arrays keep rows ``rank::size``; datasets every ``size``-th element from ``rank``;
    ``PyDataset``s and generators their items round-robin; a ``presharded`` dataset stays whole.

    Local: every rank knows the whole input. A ``tf.data`` dataset of unknown length is read up
    to this rank's first element to learn whether its share is empty.
    """
    kind = sharding.kind_of(x)
    share = PredictShare(x, kind, others=list(others))
    if size == 1 or kind in ("none", "presharded"):
        return share
    if kind == "arrays":
        share.stand_in = 0 < sharding.count_rows(x) <= rank
        if share.stand_in:
            share.x, *share.others = [None if s is None else tf.nest.map_structure(
                lambda a: a[:1], s) for s in (x, *others)]
        else:
            share.x, *share.others = sharding.shard_arrays([x, *others], rank, size, equal=False)
    elif kind == "dataset":
        shard = x.shard(size, rank)
        share.stand_in = sharding.is_empty(shard) and not sharding.is_empty(x)
        share.x = x.take(1) if share.stand_in else shard
    elif kind == "pydataset":
        total = x.num_batches
        share.stand_in = total is not None and 0 < total <= rank
        share.x = sharding.ShardedPyDataset(x, 0 if share.stand_in else rank,
                                            total if share.stand_in else size, equal=False)
    else:
        share.x = _generator_share(x, rank, size, share)
    return share


def drop(outputs: Any) -> Any:
    """Return ``outputs`` (a stand-in's predictions) with no rows, same structure and dtypes."""
    return tf.nest.map_structure(lambda a: a[:0], outputs)
