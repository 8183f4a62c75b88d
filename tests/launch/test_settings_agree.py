"""A job whose ranks disagree on a setting that picks MPI calls stops at init, on every rank,
with one message naming the setting, the values and the ranks: not a hang found minutes later by
the stall watchdog."""

from __future__ import annotations

import sys
import time

# Rank 3 alone gets another fusion threshold: the shell sets it from the launcher's rank variable
# (Open MPI's, else MPICH's) before Python starts, as a per-node environment would.
WRAPPER = ('if [ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 3 ]; then '
           'export HPCREP_FUSION_THRESHOLD=1MiB; fi; exec "$@"')
JOB = ("import hpcrep.comm as hc\n"
       "try:\n"
       "    hc.init()\n"
       "except Exception as error:\n"
       "    import sys\n"
       "    from mpi4py import MPI\n"
       "    print(f'rank {MPI.COMM_WORLD.Get_rank()}: {type(error).__name__}: {error}',\n"
       "          file=sys.stderr, flush=True)\n"
       "    sys.exit(3)\n"
       "print('initialised', flush=True)\n")


def test_rank_with_another_fusion_threshold_stops_every_rank_at_init(mpirun):
    # Ranks 0-2 spell the default out, so this also shows that the values compared are parsed.
    started = time.monotonic()
    job = mpirun.run(4, ["sh", "-c", WRAPPER, "wrapper", sys.executable, "-c", JOB],
                     timeout=120, env={"HPCREP_FUSION_THRESHOLD": "16MiB"})
    took = time.monotonic() - started
    assert job.returncode != 0, job.stdout + job.stderr
    assert "initialised" not in job.stdout
    expected = ("ConfigError: hpcrep settings that must be the same on every rank are not: "
                "HPCREP_FUSION_THRESHOLD differs between ranks (ranks 0-2: 16777216 (the "
                "default); rank 3: 1048576)")
    for rank in range(4):
        assert f"rank {rank}: {expected}" in job.stderr, job.stderr
    assert "mpirun -x HPCREP_FUSION_THRESHOLD=<value>" in job.stderr
    assert took < 60, f"the job took {took:.0f} s to fail: it should stop at init"


def test_the_same_setting_everywhere_starts(mpirun):
    job = mpirun.run(4, ["sh", "-c", WRAPPER.replace("=1MiB", "=16MiB"), "wrapper",
                         sys.executable, "-c", JOB], timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr
    assert job.stdout.count("initialised") == 4
