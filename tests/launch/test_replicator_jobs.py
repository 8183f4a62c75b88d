"""The Replicator's jobs/ examples as real MPI jobs: the synchronous regime at 2 ranks, and sync
groups at 4 ranks progressing at different rates (one group sleeps every step and, at step
HOLD_AT, waits until the other group has finished all its steps: any lockstep between groups
would deadlock, which the timeout turns into a failure) yet converging to one model; and
replicas of 2 ranks sharding a click model (tensor parallelism) at 4 ranks, and that job
refusing, on every rank, a table too big for the node."""

import json

import pytest

STEPS, HOLD_AT = 60, 10


def printed_result(mpirun, ranks, script, *job_args):
    """Run ``jobs/SCRIPT`` on ``ranks`` ranks; return the last JSON line it printed."""
    done = mpirun.run_job(ranks, script, *job_args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.timeout(500)
def test_sync_job_learns_and_keeps_replicas_equal(mpirun):
    out = printed_result(mpirun, 2, "replicator_sync.py", "--steps", 40)
    assert out["ranks"] == 2
    assert out["last_loss"] < 0.5 * out["first_loss"]
    assert out["weights_equal"]


@pytest.mark.timeout(500)
def test_async_groups_progress_at_different_rates_and_converge(mpirun):
    out = printed_result(mpirun, 4, "replicator_async.py", "--steps", STEPS, "--groups", 2,
                         "--slow-group", 1, "--slow-sleep", 0.05, "--hold-at", HOLD_AT)
    fast = [r for r in out["ranks"] if r["group"] == 0]
    slow = [r for r in out["ranks"] if r["group"] == 1]
    assert len(fast) == 2 and len(slow) == 2
    for r in slow:
        # The slow group was released only once the fast group had finished, at its step HOLD_AT.
        assert r["held_until"] == [STEPS, HOLD_AT]
    for r in fast:
        # At its last exchange the fast group was STEPS steps in; the slow one at most HOLD_AT.
        assert r["steps_seen_at_last_exchange"][0] == STEPS
        assert r["steps_seen_at_last_exchange"][1] <= HOLD_AT
        assert r["max_divergence"] >= STEPS - HOLD_AT
    assert out["final_group_steps"] == [STEPS, STEPS]
    assert out["weights_equal"]
    assert out["final_loss"] < 0.01 * out["initial_loss"]


@pytest.mark.timeout(500)
def test_tensor_parallel_job_learns_holding_half_the_parameters_per_rank(mpirun):
    out = printed_result(mpirun, 4, "replicator_tensor_parallel.py", "--ranks-per-replica", 2,
                         "--steps", 60)
    assert (out["ranks"], out["ranks_per_replica"], out["replicas"]) == (4, 2, 2)
    assert out["last_loss"] < 0.8 * out["first_loss"]
    held, whole = out["parameter_bytes_per_rank"], out["parameter_bytes_unsharded"]
    assert len(held) == 4 and all(0.5 * whole <= h < 0.51 * whole for h in held)


@pytest.mark.timeout(300)
def test_tensor_parallel_job_refuses_a_table_no_split_of_its_ranks_can_hold(mpirun):
    # 10^11 rows x 16 floats: terabytes per rank at any split of 2 ranks. Every rank agrees on
    # the figures before building anything, so every rank stops with the same message.
    done = mpirun.run_job(2, "replicator_tensor_parallel.py", "--ranks-per-replica", 1,
                          "--rows", 10**11, "--steps", 1)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert out.count("no split of this job's ranks fits") == 2, out[-3000:]
    assert "per rank at --ranks-per-replica 1 (100000000000 rows x 16)" in out, out[-3000:]
