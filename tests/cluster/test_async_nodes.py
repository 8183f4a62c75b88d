"""The asynchronous Replicator regime across nodes: jobs/replicator_async.py on 2 nodes x 2 ranks,
one sync group per node. Open MPI 4.1 over TCP has no one-sided window across nodes, so the
parameter store is the point-to-point one, served by a thread on rank 0 (node1). The group on
node1, the store's own, is the slow one: it sleeps every step and, at step HOLD_AT, waits (its
main threads sleeping, outside MPI) until node2's group has finished all its steps, which only
the store's thread can let happen; any lockstep between the groups would deadlock."""

import json
import os
import signal
import sys

import numpy as np
import pytest

JOB = "jobs/replicator_async.py"
STEPS, HOLD_AT = 60, 10


def job_result(stdout: str) -> dict:
    """The JSON line rank 0 printed (other ranks' output may share its line of mpirun's)."""
    start = stdout.rfind('{"initial_loss"')
    assert start >= 0, stdout[-4000:]
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


@pytest.mark.timeout(420)
def test_async_groups_one_per_node_slow_store_group(cluster):
    proc = cluster.popen(["-n", "4", "--map-by", "ppr:2:node"],
                         [sys.executable, JOB, "--groups", "nodes", "--steps", str(STEPS),
                          "--slow-group", "0", "--slow-sleep", "0.05", "--hold-at", str(HOLD_AT)],
                         HPCREP_STALL_TIMEOUT="120")
    try:
        out, _ = proc.communicate(timeout=360)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, out[-4000:]
    assert cluster.wait_until_gone([proc.pid], timeout=10) is not None  # the launcher has exited
    res = job_result(out)
    print(f"\nparameter store: {res['param_store']}; "
          + "; ".join(f"rank {r['rank']} on {r['host']}: group {r['group']}, "
                      f"{r['elapsed_s']} s, held until {r['held_until']}" for r in res["ranks"]))
    assert "asynchronous regime's parameter store: p2p" in out, out[-4000:]
    assert res["param_store"] == "p2p"

    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    assert [(r["host"], r["group"]) for r in ranks] == [("node1", 0), ("node1", 0),
                                                        ("node2", 1), ("node2", 1)]
    slow, fast = ranks[:2], ranks[2:]
    for r in slow:  # released only once node2's group had finished, while it stood at HOLD_AT
        assert r["held_until"] == [HOLD_AT, STEPS], r
    for r in fast:  # at its last exchange node2's group was done; node1's at most at HOLD_AT
        assert r["steps_seen_at_last_exchange"] == [r["steps_seen_at_last_exchange"][0], STEPS]
        assert r["steps_seen_at_last_exchange"][0] <= HOLD_AT, r
        assert r["max_divergence"] >= STEPS - HOLD_AT, r
        assert r["exchanges"] == STEPS, r
    assert max(r["elapsed_s"] for r in fast) < min(r["elapsed_s"] for r in slow)
    assert res["final_group_steps"] == [STEPS, STEPS]

    for group in (slow, fast):  # lockstep within a group: bitwise the same weights
        assert group[0]["weights_before_join"] == group[1]["weights_before_join"]
    assert res["weights_equal"]  # after join(): every rank holds the store's values
    initial, final = np.array(res["store_initial"]), np.array(res["store_final"])
    pushed = np.sum([r["pushed_delta_sum"] for r in ranks], axis=0)
    assert np.abs(pushed).max() > 1e-3
    np.testing.assert_allclose(final, initial + pushed, rtol=1e-12, atol=1e-12)
    weights = np.concatenate([np.ravel(w) for w in res["weights"]])
    np.testing.assert_array_equal(weights, final.astype(np.float32))
    assert res["final_loss"] < 0.01 * res["initial_loss"]
