"""ParamStore and sync groups (numpy only): atomic delta exchanges from every rank add up, step
counters track each writer, and group communicators confine collectives to the group."""

import threading

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import groups
from hpcrep.comm.param_store import ParamStore, windows_available
from hpcrep.errors import CollectiveArgumentError, OneSidedUnavailableError

pytestmark = pytest.mark.timeout(60)


def test_exchanges_from_every_rank_add_up(world, skip_missing):
    r, n = world
    if not windows_available(hc.comm()):  # e.g. Open MPI 4.1 over TCP across nodes
        with pytest.raises(OneSidedUnavailableError, match="one-sided window"):
            ParamStore(hc.comm(), 5, n)
        if hc.local_size() == hc.size():  # one node: windows over shared memory must work
            skip_missing("MPI one-sided windows on one node (ParamStore raised the error above)")
        return
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


def test_group_communicator_confines_collectives_without_changing_the_job(world):
    r, n = world
    num_groups = min(2, n)
    layout = groups.split(num_groups)
    assigned = groups.assignment(n, num_groups)
    members = [k for k in range(n) if assigned[k] == assigned[r]]
    assert layout.group_id == assigned[r]
    assert layout.group.ranks == tuple(members) and layout.group_rank == members.index(r)
    assert layout.leaders == tuple(assigned.index(g) for g in range(num_groups))
    try:
        explicit = hc.allreduce(np.array([float(r)]), op=hc.Sum, communicator=layout.group)
        assert float(explicit[0]) == sum(members)
        with hc.using(layout.group):
            assert (hc.rank(), hc.size()) == (r, n)  # the job's, inside a group too
            assert hc.current() is layout.group
            seen = []
            other = threading.Thread(target=lambda: seen.append(hc.current()))
            other.start()
            other.join()
            assert seen == [hc.communicator()]  # context-local, not process-wide
            total = hc.allreduce(np.array([1.0]), op=hc.Sum)
            assert float(total[0]) == layout.group_size
            # root_rank is a job rank: the group's last member
            got = hc.broadcast(np.array([r]), root_rank=members[-1])
            assert int(got[0]) == members[-1]
        assert hc.current() is hc.communicator()
        assert float(hc.allreduce(np.array([1.0]), op=hc.Sum)[0]) == n
    finally:
        layout.group.free()
    with pytest.raises(CollectiveArgumentError, match="has been freed"):
        hc.allreduce(np.array([1.0]), communicator=layout.group)
    with pytest.raises(CollectiveArgumentError, match="num_groups must be between"):
        groups.assignment(n, n + 1)
