"""Parameter stores and sync groups (numpy only): atomic delta exchanges from every rank add up
on both stores (MPI window, point-to-point server thread), step counters track each writer, the
server answers while its host computes and idles without spinning, the store is chosen by
HPCREP_PARAM_STORE, and group communicators confine collectives to the group."""

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import hpcrep.comm as hc
from hpcrep.comm import groups
from hpcrep.comm.param_store import ParamStore, open_store, windows_available
from hpcrep.comm.param_store_p2p import P2PParamStore
from hpcrep.errors import CollectiveArgumentError, ConfigError, OneSidedUnavailableError

pytestmark = pytest.mark.timeout(60)


def make_store(kind, skip_missing, *args, **kwargs):
    """A store of ``kind`` ('window' or 'p2p'), or None after checking why windows are absent."""
    if kind == "p2p":
        return P2PParamStore(*args, **kwargs)
    n = hc.size()
    if not windows_available(hc.comm()):  # e.g. Open MPI 4.1 over TCP across nodes
        with pytest.raises(OneSidedUnavailableError, match="one-sided window"):
            ParamStore(hc.comm(), 5, n)
        if hc.local_size() == hc.size():  # one node: windows over shared memory must work
            skip_missing("MPI one-sided windows on one node (ParamStore raised the error above)")
        return None
    return ParamStore(*args, **kwargs)


@pytest.mark.parametrize("kind", ["window", "p2p"])
def test_exchanges_from_every_rank_add_up(world, skip_missing, kind):
    """Every rank, the host included, exchanges at once; no update is lost (atomic exchanges)."""
    r, n = world
    rounds = 40
    store = make_store(kind, skip_missing, hc.comm(), 5, n, initial=np.arange(5.0), host=n - 1)
    if store is None:
        return
    assert store.kind == kind
    own = []  # my counter after each of my exchanges: exact (others' may lag)
    try:
        for _ in range(rounds):
            params, steps = store.exchange(np.full(5, r + 1.0), writer=r, new_steps=1)
            own.append(int(steps[r]))
            assert params.shape == (5,)
        hc.barrier()
        params, steps = store.read()
        with pytest.raises(CollectiveArgumentError, match="expects a delta of 5"):
            store.exchange(np.zeros(4), writer=0)
    finally:
        hc.barrier()
        store.free()
    assert own == list(range(1, rounds + 1))
    np.testing.assert_array_equal(params, np.arange(5.0) + rounds * n * (n + 1) / 2)
    np.testing.assert_array_equal(steps, np.full(n, rounds))


def test_p2p_store_serves_while_the_host_computes_outside_mpi(world):
    """The host's thread answers every other rank while the host's main thread only sleeps and
    reads its own values (no MPI call): a slow store rank never stalls the others."""
    r, n = world
    rounds, host = 25, 0
    store = P2PParamStore(hc.comm(), 3, n, initial=np.ones(3), host=host)
    served = True
    try:
        if r == host:
            deadline = time.monotonic() + 20
            while store.read()[1].sum() < rounds * (n - 1) and served:  # local: no MPI call
                served = time.monotonic() < deadline
                time.sleep(0.01)
        else:
            for _ in range(rounds):
                store.exchange(np.full(3, 0.5), writer=r, new_steps=1)
        hc.barrier()  # every rank's exchanges are done
        params, steps = store.read()
    finally:
        store.free()
    assert served, f"the host saw {steps} after 20 s: its thread did not serve every request"
    np.testing.assert_array_equal(params, np.ones(3) + 0.5 * rounds * (n - 1))
    assert steps[host] == 0 and all(steps[k] == rounds for k in range(n) if k != host)
    with pytest.raises(CollectiveArgumentError, match="has been freed"):
        store.read()


def _thread_cpu_seconds(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux /proc)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_p2p_server_does_not_spin_a_core(world):
    """The server thread polls with growing sleeps: idle for 2 s it uses well under 10% of a
    core (a spinning loop takes all the core it gets)."""
    r, n = world
    store = P2PParamStore(hc.comm(), 3, n, host=0)
    try:
        store.exchange(np.ones(3), writer=r)  # a request each, then silence
        hc.barrier()
        if r == 0:
            tid = store._thread.native_id
            before, start = _thread_cpu_seconds(tid), time.monotonic()
        time.sleep(2.0)  # every rank idle, outside MPI
        if r == 0:
            used = _thread_cpu_seconds(tid) - before
            share = used / (time.monotonic() - start)
            print(f"idle server thread: {used:.3f} CPU s in 2 s ({100 * share:.1f}% of a core)")
            assert share < 0.1
    finally:
        store.free()


def test_open_store_picks_the_window_where_windows_exist_else_p2p(world, monkeypatch):
    r, n = world
    monkeypatch.delenv("HPCREP_PARAM_STORE", raising=False)
    expected = "window" if windows_available(hc.comm()) else "p2p"
    if hc.local_size() == hc.size():
        assert expected == "window", "one node: windows over shared memory must work"
    store = open_store(hc.comm(), 2, 1, initial=np.ones(2))
    assert store.kind == expected
    store.free()
    monkeypatch.setenv("HPCREP_PARAM_STORE", "p2p")
    store = open_store(hc.comm(), 2, 1, initial=np.ones(2))
    assert store.kind == "p2p"
    np.testing.assert_array_equal(store.read()[0], np.ones(2))
    store.free()
    if n > 1:  # the setting must agree on every rank, or every rank raises
        monkeypatch.setenv("HPCREP_PARAM_STORE", "p2p" if r == 0 else "window")
        with pytest.raises(ConfigError, match="HPCREP_PARAM_STORE differs between ranks"):
            open_store(hc.comm(), 2, 1)


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
