"""Grow a job back after it lost ranks (ULFM, ``--with-ft ulfm``; ``HPCREP_ELASTIC_MAX_NP``).

After :mod:`hpcrep.comm.recovery` has shrunk the job to its survivors, the slots the lost ranks
held may be free again (their processes are gone). At a commit of ``@hvd.elastic.run``'s state
(:func:`planned`, collective) rank 0 counts, on the hosts the job still runs on, the slots the
first world had there minus the ranks running there now; if the job is smaller than
``HPCREP_ELASTIC_MAX_NP`` and slots are free, :func:`grow` spawns the same program
(``sys.orig_argv``) into them with ``MPI_Comm_spawn``, merges the new ranks in after the running
ones and makes the merged communicator the job's world in place (:func:`hpcrep.comm.world.replace`).
The new ranks join in their :func:`hpcrep.comm.init` (:func:`hpcrep.comm.world.spawned_to_grow`)
and meet the others in the state's ``sync``, which gives them rank 0's state.

A host the job no longer runs on is not spawned onto: Open MPI 5.0.11 did not start spawned
ranks on a node whose link came back after a cut (``PMIx_Connect`` "Not supported" in their
``MPI_Init``), and the partitioned side's stale failure reports then aborted a survivor. Such a
host rejoins through a relaunch instead, under ``hpcrep run --elastic --max-np``
(:mod:`hpcrep.comm.hosts_back`): when the launcher reports it back, the plan at the next commit
is to stop there (:func:`stop_to_relaunch`) and ``hpcrep run`` starts the job again on every host
from that commit.

mpi4py only; never TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import time
from typing import Any, Optional

from hpcrep import config
from hpcrep.comm import hosts_back, recovery, watchdog, world
from hpcrep.errors import GrowFailedError


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where :func:`grow` puts new ranks: ``(host, count)`` pairs, in host order; or, with
    ``healed``, the hosts without ranks that answer again, which only a relaunch can use
    (:func:`stop_to_relaunch`; ``places`` is then empty)."""

    places: tuple[tuple[str, int], ...]
    healed: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        """How many ranks the plan adds in this job (0 for a relaunch)."""
        return sum(n for _, n in self.places)

    def __str__(self) -> str:
        if self.healed:
            return f"relaunch onto {', '.join(self.healed)} too"
        return ", ".join(f"{n} on {host}" for host, n in self.places)


@dataclasses.dataclass(frozen=True)
class Growth:
    """One growth, as :func:`grow` returns it (and :func:`history` keeps).

    Attributes:
        old_size: the job's size before, ``new_size`` after.
        plan: where the new ranks went.
        spawn_seconds: spawning the new ranks until they had merged with the job (their
            Python start-up and ``import`` s included).
        rebuild_seconds: the new world's communicators (node splits, watchdog).
    """

    old_size: int
    new_size: int
    plan: Plan
    spawn_seconds: float
    rebuild_seconds: float


_slots: dict[str, int] = {}   # ranks per host in the job's first world: what may be refilled
_history: list[Growth] = []


def _mpi() -> Any:
    from mpi4py import MPI  # noqa: PLC0415 - MPI only when it is used

    return MPI


def max_size() -> int:
    """``HPCREP_ELASTIC_MAX_NP``: the size the job grows back to (0: it never grows). Local."""
    return config.get("HPCREP_ELASTIC_MAX_NP")


def capacity(slots: dict[str, int], running: tuple[str, ...], want: int) -> Optional[Plan]:
    """Return where up to ``want`` new ranks fit, or None: on each host that runs a rank now
    (``running``: the host of each rank), the ``slots`` it had in the first world minus the
    ranks it runs now. Hosts the job no longer runs on are left out (see the module). Local."""
    live = collections.Counter(running)
    places = []
    for host in sorted(slots):
        free = slots[host] - live.get(host, 0)
        if want > 0 and live.get(host, 0) > 0 and free > 0:
            places.append((host, min(free, want)))
            want -= places[-1][1]
    return Plan(tuple(places)) if places else None


def planned() -> Optional[Plan]:
    """Return the :class:`Plan` to grow the job by now, or None, the same on every rank: only
    where the job can outlive a rank (:func:`hpcrep.comm.recovery.enabled`) and is smaller than
    :func:`max_size`; rank 0 counts the free slots (:func:`capacity`) and broadcasts them.

    Collective: every rank of the job must call this (an elastic state's ``commit`` does); a
    broadcast only while the job is below its maximum size.

    Raises:
        RankFailedError: a rank failed meanwhile.
    """
    size, most = world.size(), max_size()
    if most <= size or not recovery.enabled():
        return None
    plan = _plan(most - size) if world.rank() == 0 else None
    try:
        return world.comm().bcast(plan, root=0)
    except Exception as exc:
        if recovery.note(exc):
            recovery.raise_failure(exc)
        raise


def _plan(want: int) -> Optional[Plan]:
    """Rank 0's side of :func:`planned`: a relaunch if ``hpcrep run`` reported a lost host back
    (:mod:`hpcrep.comm.hosts_back`; then every host is used), else the free slots here."""
    running = watchdog.hosts()
    directory = config.get("HPCREP_ELASTIC_DIR")
    if directory:
        hosts_back.publish_running(directory, running)
        healed = hosts_back.hosts_back(directory, running)
        if healed:
            return Plan((), healed)
    return capacity(_slots, running, want)


def stop_to_relaunch(plan: Plan) -> None:
    """End this process (``SystemExit(0)``, so that exit handlers and ``MPI_Finalize`` run) for
    ``hpcrep run`` to relaunch the job onto ``plan.healed`` and the hosts it runs on (or, for a
    plan of free slots, which the transparent ``fit`` cannot spawn into, onto the same hosts),
    from the commit that made the plan (already in ``HPCREP_ELASTIC_DIR``). Rank 0 writes the
    request and logs one line; no rank leaves before it is written.

    Collective: every rank of the job must call this with the same plan (from :func:`planned`).

    Raises:
        SystemExit: always (status 0), on every rank.
        RankFailedError: a rank failed before the request was written.
    """
    directory = config.get("HPCREP_ELASTIC_DIR")
    if world.rank() == 0:
        hosts = plan.healed or tuple(host for host, _ in plan.places)
        hosts_back.request_relaunch(directory, hosts, world.size(), max_size())
        why = (f"{', '.join(plan.healed)} answer(s) again" if plan.healed
               else f"slots are free again ({plan})")
        print(f"hpcrep: {why}: the job stops at this commit ({world.size()} ranks) and hpcrep "
              f"run relaunches it on up to {max_size()} ranks from it", file=sys.stderr,
              flush=True)
    try:
        world.comm().barrier()
    except Exception as exc:
        if recovery.note(exc):
            recovery.raise_failure(exc)
        raise
    recovery.finish_sooner(2.0)  # the relaunch waits for this job's mpirun to end
    raise SystemExit(0)


def grow(plan: Plan) -> Growth:
    """Spawn ``plan``'s ranks (this program again, ``sys.orig_argv``), merge them in after the
    running ranks and make the result the job's world, in place. Logs one line on rank 0's
    stderr. The new ranks call :func:`hpcrep.comm.init` at their program's start and then must
    meet the running ranks in a collective that gives them the state (``@hvd.elastic.run``'s
    sync: no other collective may come first in the program).

    Collective: every rank of the job must call this with the same plan (from :func:`planned`).

    Raises:
        GrowFailedError: the spawn failed, or a rank failed during it (on the ranks that see
            it; the first to raise it ends the job).
    """
    MPI = _mpi()
    old_size = world.size()
    start = time.perf_counter()
    info = MPI.Info.Create()
    info.Set("host", ",".join(f"{host}:{n}" for host, n in plan.places))
    info.Set("wdir", os.getcwd())
    info.Set("PMIX_ENVAR", f"{world.GROW_CHILD_ENV}=1")
    try:
        # the stall watchdog ends the job if the spawn never returns (a rank lost during it
        # and no survivor left to abort the job)
        with watchdog.watching("spawn", (f"{plan.count} rank(s)",)):
            link = world.comm().Spawn(sys.executable, list(sys.orig_argv[1:]), plan.count,
                                      info=info, root=0)
    except Exception as exc:
        what = "a rank failed" if recovery.note(exc) else f"the spawn failed ({exc})"
        raise GrowFailedError(
            f"{what} while the job grew back from {old_size} ranks (spawning {plan}): a job "
            "cannot shrink in the middle of MPI_Comm_spawn, so it ends here. hpcrep run "
            "--elastic relaunches it from the last commit; under plain mpirun, run it again "
            "(it resumes from the commit in HPCREP_ELASTIC_DIR).") from exc
    finally:
        info.Free()
    link.Set_errhandler(MPI.ERRORS_RETURN)
    merged = link.Merge(high=False)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    world.add_link(link)
    spawned = time.perf_counter()
    world.replace(merged)
    _share_slots()
    done = Growth(old_size=old_size, new_size=world.size(), plan=plan,
                  spawn_seconds=spawned - start, rebuild_seconds=time.perf_counter() - spawned)
    _history.append(done)
    if world.rank() == 0:
        print(f"hpcrep: the job grew from {old_size} to {done.new_size} ranks ({plan}; spawn + "
              f"merge {done.spawn_seconds * 1e3:.0f} ms, new world "
              f"{done.rebuild_seconds * 1e3:.0f} ms)", file=sys.stderr, flush=True)
    return done


def _share_slots() -> None:
    """Give every rank rank 0's slot table (new ranks learn the first world's). Collective."""
    global _slots
    _slots = world.comm().bcast(_slots if world.rank() == 0 else None, root=0)


def _at_init() -> None:
    """Remember the first world's ranks per host; a rank spawned to grow a job receives them
    from rank 0 instead (the other half of :func:`grow`'s broadcast)."""
    global _slots
    if world.spawned_to_grow():
        _share_slots()
    else:
        _slots = dict(collections.Counter(watchdog.hosts()))


def history() -> list[Growth]:
    """Return the growths this rank took part in, oldest first (a spawned rank's list starts
    after it joined). Local."""
    return list(_history)


world.at_init(_at_init)
