"""Replicator options checked without MPI: reductions by name, regimes, group assignment."""

import pytest
import tensorflow as tf

from hpcrep.comm.groups import assignment
from hpcrep.comm.ops import ReduceOp
from hpcrep.errors import CollectiveArgumentError, ReplicaContextError, ReplicatorError
from hpcrep.replicator import Synchronous, SyncGroups, get_replica_context, in_replica_context
from hpcrep.replicator.context import as_op
from hpcrep.replicator.regimes import as_regime


@pytest.mark.parametrize("op, expected", [
    ("sum", ReduceOp.Sum), ("MEAN", ReduceOp.Average), ("min", ReduceOp.Min),
    ("max", ReduceOp.Max), (ReduceOp.Sum, ReduceOp.Sum),
    (tf.distribute.ReduceOp.MEAN, ReduceOp.Average), (tf.distribute.ReduceOp.SUM, ReduceOp.Sum),
])
def test_reductions_by_name(op, expected):
    assert as_op(op) is expected


@pytest.mark.parametrize("op", ["product", ReduceOp.Product, "median", 17])
def test_other_reductions_are_rejected(op):
    with pytest.raises(ReplicatorError, match="expected 'sum', 'mean', 'min' or 'max'"):
        as_op(op)


def test_regimes():
    assert as_regime("sync") == Synchronous() and as_regime(None) == Synchronous()
    assert as_regime("async") == SyncGroups()
    groups = SyncGroups(num_groups=3, exchange_every=2)
    assert as_regime(groups) is groups
    with pytest.raises(ReplicatorError, match="unknown regime"):
        as_regime("hogwild")
    with pytest.raises(ReplicatorError, match="exchange_every must be >= 1"):
        SyncGroups(exchange_every=0)
    assert SyncGroups(num_groups=4).scale == 0.25 and SyncGroups(delta_scale=1.0).scale == 1.0
    with pytest.raises(ReplicatorError, match="delta_scale must be a positive"):
        SyncGroups(delta_scale=0.0)


def test_group_assignment_is_contiguous_and_balanced():
    assert assignment(4, 2) == [0, 0, 1, 1]
    assert assignment(5, 2) == [0, 0, 0, 1, 1]
    assert assignment(3, 3) == [0, 1, 2]
    assert assignment(1, 1) == [0]
    for bad in (0, 5):
        with pytest.raises(CollectiveArgumentError, match="num_groups must be between 1 and"):
            assignment(4, bad)


def test_no_replica_context_outside_run():
    assert not in_replica_context()
    with pytest.raises(ReplicaContextError, match="outside a step function"):
        get_replica_context()
