"""ParamStore and sync groups (numpy only): atomic delta exchanges from every rank add up, step
counters track each writer, and group worlds confine collectives to the group."""

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import groups
from hpcrep.comm.param_store import ParamStore
from hpcrep.errors import CollectiveArgumentError

pytestmark = pytest.mark.timeout(60)


def test_exchanges_from_every_rank_add_up(world):
    r, n = world
    store = ParamStore(hc.comm(), 5, n, initial=np.arange(5.0), host=n - 1)
    try:
        for k in range(3):
            params, steps = store.exchange(np.full(5, r + 1.0), writer=r, new_steps=1)
            assert steps[r] == k + 1  # my own counter is exact; others may lag
            assert params.shape == (5,)
        hc.barrier()
        params, steps = store.read()
        np.testing.assert_allclose(params, np.arange(5.0) + 3 * n * (n + 1) / 2)
        np.testing.assert_array_equal(steps, np.full(n, 3))
        with pytest.raises(CollectiveArgumentError, match="expects a delta of 5"):
            store.exchange(np.zeros(4), writer=0)
    finally:
        hc.barrier()
        store.free()


def test_group_world_confines_collectives(world):
    r, n = world
    num_groups = min(2, n)
    layout = groups.split(num_groups)
    assert layout.group_id == groups.assignment(n, num_groups)[r]
    group_world = groups.make_world(layout)
    saved = groups.swap(group_world)
    try:
        assert hc.size() == layout.group_size and hc.rank() == layout.group_rank
        total = hc.allreduce(np.array([1.0]), op=hc.Sum)
        assert float(total[0]) == layout.group_size
    finally:
        groups.swap(saved)
    assert hc.size() == n
    groups.free_world(group_world)
    layout.group_comm.Free()
    with pytest.raises(CollectiveArgumentError, match="num_groups must be between"):
        groups.assignment(n, n + 1)
