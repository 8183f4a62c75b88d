"""Horovod process sets at the comm layer (numpy only): registration and ids as in Horovod's
test_tensorflow_process_sets_dynamic.py, every collective's values within each set, clear errors
for ranks outside a set and for bad input on every rank, and sets freed at shutdown."""

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import process_sets
from hpcrep.errors import CollectiveArgumentError, CollectiveMismatchError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def even_odd(world):
    """Register the even and the odd job ranks as two sets (needs 2+ ranks); remove them after."""
    r, n = world
    if n == 1:
        pytest.skip("two disjoint process sets need 2 or more ranks")
    even = hc.add_process_set([k for k in range(n) if k % 2 == 0])
    odd = hc.add_process_set(hc.ProcessSet([k for k in range(n) if k % 2 == 1]))
    yield even, odd
    assert hc.remove_process_set(even) and hc.remove_process_set(odd)
    assert process_sets.registered() == {0: list(range(n))}


def test_registration_ids_and_duplicates(world):
    r, n = world
    assert process_sets.registered() == {0: list(range(n))}
    assert str(hc.global_process_set) == (
        f"ProcessSet(process_set_id=0, ranks={list(range(n))}, mpi_comm=None)")
    assert hc.global_process_set.size() == n and hc.global_process_set.rank() == r
    assert hc.global_process_set.included()
    unregistered = hc.ProcessSet([n - 1, 0])
    assert unregistered.ranks == sorted([n - 1, 0])
    assert unregistered.size() is None and unregistered.rank() is None
    assert unregistered.included() == (r in (0, n - 1))
    with pytest.raises(CollectiveArgumentError, match="duplicate of hvd.global_process_set"):
        hc.add_process_set(range(n))
    assert not hc.remove_process_set(hc.global_process_set)
    assert not hc.remove_process_set(unregistered)
    if n == 1:
        return
    set1 = hc.add_process_set([0])
    set2 = hc.add_process_set(np.arange(n - 1, 0, -1))  # numpy integers are ranks too
    assert (set1.process_set_id, set2.process_set_id) == (1, 2)
    assert set2.ranks == list(range(1, n))
    assert process_sets.registered() == {0: list(range(n)), 1: [0], 2: list(range(1, n))}
    assert str(set2) == f"ProcessSet(process_set_id=2, ranks={list(range(1, n))}, mpi_comm=None)"
    assert hc.allgather_object(set2.process_set_id) == [2] * n
    with pytest.raises(CollectiveArgumentError, match="duplicate of registered process set 2"):
        hc.add_process_set(range(1, n))
    with pytest.raises(CollectiveArgumentError, match="already registered with id 1"):
        hc.add_process_set(set1)
    assert hc.remove_process_set(set1) and set1.process_set_id is None
    assert not hc.remove_process_set(set1)
    assert process_sets.registered() == {0: list(range(n)), 2: list(range(1, n))}
    hc.add_process_set(set1)  # re-adding takes the smallest free id again
    assert set1.process_set_id == 1
    assert hc.remove_process_set(set1)
    if n > 2:
        set3 = hc.add_process_set([0, n - 1])
        assert set3.process_set_id == 1  # id reuse, as in Horovod
        assert hc.remove_process_set(set3)
    assert hc.remove_process_set(set2)
    assert process_sets.registered() == {0: list(range(n))}


def test_values_within_each_set(world, even_odd):
    r, n = world
    even, odd = even_odd
    mine, other = (even, odd) if r % 2 == 0 else (odd, even)
    members = mine.ranks
    assert mine.included() and not other.included()
    assert mine.size() == len(members) and mine.rank() == members.index(r)
    assert other.size() == len(other.ranks)
    total = hc.allreduce(np.array([float(r), 1.0]), hc.Sum, communicator=mine)
    np.testing.assert_array_equal(total, [sum(members), len(members)])
    avg = hc.grouped_allreduce([np.full(3, float(r)), np.array([r], np.int64)], hc.Average,
                               communicator=mine)
    np.testing.assert_allclose(avg[0], np.full(3, np.mean(members)))
    np.testing.assert_array_equal(avg[1], [sum(members) // len(members)])
    gathered, rows = hc.allgatherv(np.full((r + 1, 2), r), communicator=mine)
    np.testing.assert_array_equal(rows, [k + 1 for k in members])
    np.testing.assert_array_equal(gathered, np.concatenate([np.full((k + 1, 2), k)
                                                            for k in members]))
    root = members[-1]  # a job rank, as in Horovod
    np.testing.assert_array_equal(hc.broadcast(np.full(4, r), root, communicator=mine),
                                  np.full(4, root))
    received, splits = hc.alltoall(np.full(len(members) * (r + 1), r),
                                   [r + 1] * len(members), communicator=mine)
    np.testing.assert_array_equal(splits, [k + 1 for k in members])
    np.testing.assert_array_equal(received, np.repeat(members, [k + 1 for k in members]))
    share = hc.reducescatter(np.ones((len(members), 2)) * r, hc.Sum, communicator=mine)
    np.testing.assert_array_equal(share, np.full((1, 2), float(sum(members))))
    assert hc.broadcast_object({"root": r}, root, communicator=mine) == {"root": root}
    assert hc.allgather_object(r, communicator=mine) == members
    hc.barrier(communicator=mine)
    with hc.using(mine):  # the set as the default communicator, the job's rank unchanged
        assert hc.rank() == r and hc.size() == n
        assert float(hc.allreduce(np.array([1.0]), hc.Sum)[0]) == len(members)
    # Both sets run their collectives at the same time without crossing.
    assert float(hc.allreduce(np.array([1.0]), hc.Sum)[0]) == n


def test_ranks_outside_a_set_get_a_clear_error(world, even_odd):
    r, n = world
    even, odd = even_odd
    other = odd if r % 2 == 0 else even
    with pytest.raises(CollectiveArgumentError, match=rf"job rank {r}\) is not in ProcessSet"):
        hc.allreduce(np.ones(2), communicator=other)
    with pytest.raises(CollectiveArgumentError, match="is not in ProcessSet"):
        hc.broadcast_object(1, other.ranks[0], communicator=other)
    with pytest.raises(ValueError, match="is not in ProcessSet"):
        other.rank()
    mine = even if r % 2 == 0 else odd
    with pytest.raises(CollectiveArgumentError, match="root_rank=.* is not a rank of process set"):
        hc.broadcast(np.ones(2), other.ranks[0], communicator=mine)
    hc.barrier()  # every rank failed locally; nobody is left waiting


def test_bad_input_raises_on_every_rank(world):
    r, n = world
    if n > 1:
        with pytest.raises(CollectiveMismatchError, match="add_process_set"):
            hc.add_process_set([0, r])  # rank 0 passes [0], the others [0, r]
    with pytest.raises(CollectiveArgumentError, match=r"ranks \[%d\] are not ranks of the job" % n):
        hc.add_process_set([0, n])
    with pytest.raises(CollectiveArgumentError, match="at least one rank"):
        hc.add_process_set([])
    with pytest.raises(CollectiveArgumentError, match="more than once"):
        hc.add_process_set([0, 0])
    with pytest.raises(CollectiveArgumentError, match="must be integers"):
        hc.ProcessSet([0, "1"])
    never_added = hc.ProcessSet([0])
    with pytest.raises(CollectiveArgumentError, match="is not registered"):
        hc.allreduce(np.ones(1), communicator=never_added)
    fake = hc.ProcessSet([0])
    fake.process_set_id = 10  # as Horovod's test: an id nobody registered
    with pytest.raises(ValueError, match="is not registered"):
        hc.allreduce(np.ones(1), communicator=fake)
    with pytest.raises(CollectiveArgumentError, match="expected a process set"):
        hc.allreduce(np.ones(1), communicator=[0, 1])
    assert process_sets.registered() == {0: list(range(n))}


def test_shutdown_frees_sets_and_forgets_ids(world):
    r, n = world
    if n == 1:
        pytest.skip("needs a set other than the global one")
    kept = hc.add_process_set([0])
    communicator = kept.communicator() if r == 0 else None
    hc.shutdown()
    hc.init()
    assert process_sets.registered() == {0: list(range(n))}
    with pytest.raises(CollectiveArgumentError, match="is not registered"):
        kept.size()
    if communicator is not None:
        with pytest.raises(CollectiveArgumentError, match="has been freed"):
            hc.allreduce(np.ones(1), communicator=communicator)
    again = hc.add_process_set([0])
    assert again.process_set_id == 1
    assert hc.remove_process_set(again)
