"""Go on in the same processes after a rank of the job failed (ULFM, ``--with-ft ulfm``).

Where the MPI has ULFM and the job runs with fault tolerance on (:func:`enabled`), an MPI call
of hpcrep's collectives that needs a dead rank raises ``MPI.Exception`` instead of ending the
job. :func:`note` (called by :func:`hpcrep.comm.collectives.collective` for every collective)
recognises it, revokes the job's communicators, so that every other survivor's pending or next
collective fails at once instead of waiting, and the collective raises
:class:`~hpcrep.errors.RankFailedError`. Every survivor then calls :func:`recover`: the job's
world is shrunk to the living ranks (:func:`hpcrep.comm.ulfm.shrink`) and replaced in place
(:func:`hpcrep.comm.world.replace`), so ``rank()``/``size()`` and everything holding the job's
communicator, traced ``tf.function`` s included, run on the survivors. ``@hvd.elastic.run``
(:mod:`hpcrep.tensorflow.elastic`) does this and returns to the last commit.

mpi4py only; never TensorFlow.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Optional

from hpcrep import config
from hpcrep.comm import ulfm, watchdog, world
from hpcrep.comm.abort import done_notice
from hpcrep.errors import HpcrepError, RankFailedError


@dataclasses.dataclass(frozen=True)
class Recovery:
    """One recovery, as :func:`recover` returns it (and :func:`history` keeps).

    Attributes:
        lost: job ranks (before the recovery) that were lost.
        old_size: the job's size before, ``new_size`` after.
        step: the smallest step the survivors passed to :func:`recover`.
        noticed: ``time.time()`` when this rank first saw the failure.
        shrink_seconds: revoke, shrink and agreement on this rank.
        rebuild_seconds: the new world's communicators (node splits, watchdog).
    """

    lost: tuple[int, ...]
    old_size: int
    new_size: int
    step: int
    noticed: float
    shrink_seconds: float
    rebuild_seconds: float


_lock = threading.Lock()
_failure: Optional[str] = None   # what the first failure seen since the last recovery said
_noticed: float = 0.0
_history: list[Recovery] = []
_finalize_hooked = False
_finalize_seconds = 10.0  # how long _at_exit lets MPI_Finalize take (finish_sooner shortens it)


def enabled() -> bool:
    """Return True if survivors of a failed rank can go on in this job: ULFM in the MPI library
    and fault tolerance on (:func:`hpcrep.comm.ulfm.has_ulfm`). Local."""
    return ulfm.has_ulfm()


def note(exc: BaseException) -> bool:
    """If ``exc`` says a rank failed (:func:`hpcrep.comm.ulfm.is_failure`), remember it, revoke
    the job's communicators (every survivor's collective on them fails at once) and return True;
    else return False. Local; cheap for any other exception."""
    global _failure, _noticed
    if type(exc).__module__ != "mpi4py.MPI" or not ulfm.is_failure(exc):
        return False
    with _lock:
        first = _failure is None
        if first:
            _failure, _noticed = str(exc), time.time()
    if first and world.is_initialized():
        world.communicator().revoke()
    return True


def failed() -> bool:
    """Return True if this rank has seen a failed rank since the last :func:`recover`. Local."""
    return _failure is not None


def raise_failure(exc: BaseException) -> None:
    """Raise :class:`RankFailedError` for the failure ``exc`` (which :func:`note` took)."""
    raise RankFailedError(
        f"a rank of the job failed ({_failure or exc}); the survivors can go on: under "
        "@hvd.elastic.run they return to the last commit on their own, elsewhere call "
        "hpcrep.comm.recovery.recover() on every survivor.") from exc


def confirm() -> None:
    """Raise :class:`RankFailedError` on every survivor if any rank of the job has failed, even
    one no collective has needed yet (a fault-tolerant agreement: the same answer everywhere).

    Collective: every living rank of the job must call this. ``@hvd.elastic.run`` calls it
    after the training function returns, so no survivor leaves while others recover.
    """
    if not enabled():
        return
    comm = world.comm()
    try:
        comm.Agree(1)
    except Exception as exc:  # only a failure is turned into RankFailedError
        if note(exc):
            raise_failure(exc)
        raise


def recover(step: int = 0) -> Recovery:
    """Shrink the job to its living ranks and go on: the job's world is replaced in place by
    the survivors (new ranks ``0 .. n - 1`` in the old order), process sets are dropped, and
    the failure is forgotten. Logs one line on the new rank 0's stderr.

    Args:
        step: the last step this rank completed; the result's ``step`` is the smallest of them.

    A side without a quorum (:func:`has_quorum`: at most half of the ranks, and not half with
    rank 0) does not go on: its ranks say why on stderr and end themselves with SIGKILL, so
    that a partitioned job never trains as two.

    Raises:
        FaultToleranceUnavailableError: this MPI has no ULFM (says how to get it).

    Collective: every surviving rank must call this, after the failure (a rank that has not
    seen it yet would keep the others waiting: :func:`confirm` makes every rank see it).
    """
    global _failure
    noticed = _noticed or time.time()
    old = world.communicator()
    old_size = len(old.ranks)
    hosts, pids = watchdog.hosts(), watchdog.pids()
    shrunk = ulfm.shrink(old.comm, step)
    start = time.perf_counter()
    _stop_unless_quorum(shrunk, old_size, hosts)
    _end_lost_neighbours(shrunk, hosts, pids)
    _stop_below_minimum(shrunk, old_size)
    world.drop_links()  # a link to spawned ranks may hold a lost one: never disconnected
    world.replace(shrunk.comm)
    done = Recovery(lost=shrunk.lost, old_size=old_size, new_size=shrunk.comm.Get_size(),
                    step=shrunk.step, noticed=noticed, shrink_seconds=shrunk.seconds,
                    rebuild_seconds=time.perf_counter() - start)
    with _lock:
        _failure = None
        _history.append(done)

    if world.rank() == 0:
        print(f"hpcrep: rank(s) {', '.join(map(str, done.lost))} of {old_size} failed; "
              f"{done.new_size} survivors go on from step {done.step} (revoke + shrink "
              f"{done.shrink_seconds * 1e3:.0f} ms, new world {done.rebuild_seconds * 1e3:.0f} "
              "ms)", file=sys.stderr, flush=True)
    return done


def has_quorum(survivors: tuple[int, ...], old_size: int) -> bool:
    """Return True if ``survivors`` (ranks of a job of ``old_size``) may go on: more than half
    of the ranks, or exactly half with rank 0 among them. A cut network looks to each side as
    if the other side had failed; only one side can have a quorum, so the job never splits into
    two that train (and write) apart. Local."""
    return 2 * len(survivors) > old_size or (2 * len(survivors) == old_size and 0 in survivors)


def _stop_unless_quorum(shrunk: ulfm.Shrunk, old_size: int, hosts: tuple[str, ...]) -> None:
    """End this process with SIGKILL if its side of the shrink has no quorum
    (:func:`has_quorum`), saying so on stderr.

    SIGKILL, not an exit status: a killed rank is a failure a ``--with-ft ulfm`` job outlives,
    whereas a non-zero exit makes ``prterun`` end the whole job once it hears of it. On the
    fixture this side exited 75 while node2 was cut; when the link came back 20 s later, prterun
    learned of those exits and ended the other side's job, which was going on without them."""
    if has_quorum(shrunk.survivors, old_size):
        return
    where = sorted({hosts[r] for r in shrunk.lost}) if hosts else []
    on = f" on {', '.join(where)}" if where else ""
    print(f"hpcrep: rank {shrunk.survivors[shrunk.comm.Get_rank()]} stops: only "
          f"{len(shrunk.survivors)} of {old_size} ranks are left on its side (ranks "
          f"{', '.join(map(str, shrunk.lost))} unreachable{on}), "
          "not a majority: a network partition or the loss of half the job. The other side goes "
          "on if it holds the majority (or half with rank 0); restart from the last commit "
          "otherwise.", file=sys.stderr, flush=True)
    _drop_unsent_tcp()
    os.kill(os.getpid(), signal.SIGKILL)


def _drop_unsent_tcp() -> None:
    """Make this process's TCP connections end with a reset, their unsent data dropped, when it
    ends: after a cut, what this side's MPI queued for the other side (among it, reports that the
    other side's ranks failed) would otherwise be sent by the kernel once the link comes back,
    and a rank told it has failed aborts. Local; sockets only (other descriptors are skipped)."""
    import socket  # noqa: PLC0415 - only on the way out of a partitioned rank
    import struct  # noqa: PLC0415

    try:
        descriptors = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in descriptors:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET,
                                                                  socket.AF_INET6):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays open: the exit closes it


TOO_FEW_EXIT = 76  # the survivors of a failure are fewer than HPCREP_ELASTIC_MIN_NP


def _stop_below_minimum(shrunk: ulfm.Shrunk, old_size: int) -> None:
    """End this process (exit status :data:`TOO_FEW_EXIT`) if fewer ranks than
    ``HPCREP_ELASTIC_MIN_NP`` survived, saying so on stderr (the new rank 0 only)."""
    minimum = config.get("HPCREP_ELASTIC_MIN_NP")
    survivors = shrunk.comm.Get_size()
    if survivors >= minimum:
        return
    if shrunk.comm.Get_rank() == 0:
        directory = config.get("HPCREP_ELASTIC_DIR")
        kept = (f"the last commit is in {directory}" if directory else
                "set HPCREP_ELASTIC_DIR (hpcrep run --elastic does) to keep commits on disk")
        print(f"hpcrep: only {survivors} of {old_size} ranks survived (ranks "
              f"{', '.join(map(str, shrunk.lost))} lost), fewer than HPCREP_ELASTIC_MIN_NP="
              f"{minimum}: the job stops; {kept}. Relaunch on enough hosts to resume from it.",
              file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(TOO_FEW_EXIT)


def _end_lost_neighbours(shrunk: ulfm.Shrunk, hosts: tuple[str, ...],
                         pids: tuple[int, ...]) -> None:
    """SIGKILL the lost ranks that run on this rank's host and may still be alive: a rank that
    hangs (stopped, or stuck outside MPI) is declared failed by ULFM's heartbeat detector, but
    its process would keep ``mpirun`` from ending. The first survivor on each host does it."""
    if not hosts or not pids:
        return
    me = shrunk.survivors[shrunk.comm.Get_rank()]
    here = hosts[me]
    if min(r for r in shrunk.survivors if hosts[r] == here) != me:
        return
    for lost in shrunk.lost:
        if hosts[lost] == here:
            try:
                os.kill(pids[lost], signal.SIGKILL)
            except OSError:  # gone already (the usual case), or not ours to end
                pass


def leave_as_failed(message: str) -> None:
    """End this process as a failed rank of a fault-tolerant job: print ``message`` on stderr,
    flush, and SIGKILL this process, so that the other ranks see a lost rank (and go on under
    ``@hvd.elastic.run``, or fail and end) instead of waiting for good on a rank that is only
    exiting: an exiting rank is not detected as failed, and its ``MPI_Finalize`` would wait for
    the others. No return. Local."""
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def is_own_failure(exc: Optional[BaseException]) -> bool:
    """Return True if ``exc``, unhandled, is this rank's own failure (the program's exception),
    which should end it as a failed rank; False for hpcrep's errors, which the ranks raise
    together (a failed growth, an agreed check) and end the job as before. Local."""
    return exc is not None and not isinstance(exc, HpcrepError)


def _leave_on_unhandled_exception() -> None:
    """Make an unhandled exception of the program's own end this rank as a failed one, after the
    usual traceback (:func:`leave_as_failed`); undone at :func:`hpcrep.comm.shutdown`. Local."""
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: object) -> None:
        previous(kind, value, tb)
        if not is_own_failure(value):
            return
        leave_as_failed(f"hpcrep: rank {world.rank()} ended with an unhandled {kind.__name__} "
                        "in a fault-tolerant job: it leaves as a failed rank, so that the others "
                        "go on (@hvd.elastic.run) or end, rather than wait for it")

    sys.excepthook = hook

    def restore() -> None:
        if sys.excepthook is hook:
            sys.excepthook = previous

    world.at_shutdown(restore)


def arm() -> None:
    """In a job started with fault tolerance on, end MPI at exit the way :func:`_at_exit` does:
    Open MPI 5's ``MPI_Finalize`` there can wait for good, with or without a failure (4 ranks on
    2 nodes with the threaded detector and no failure sat in it after writing their results).
    Registered after mpi4py's own exit hook, so it runs first. Where ULFM's heartbeat detector
    runs without its own thread, also starts the thread that keeps MPI progressing for it
    (:func:`hpcrep.comm.ulfm.start_progress`). An unhandled exception then ends the rank as a
    failed one (:func:`leave_as_failed`). Local; once. :func:`hpcrep.comm.init` calls it
    (registered with :func:`hpcrep.comm.world.at_init`)."""
    global _finalize_hooked
    with _lock:
        if not _finalize_hooked and ulfm.ft_enabled() and world.is_initialized():
            atexit.register(_at_exit)
            _finalize_hooked = True
            _leave_on_unhandled_exception()
            if ulfm.detector_needs_progress() and not ulfm.start_progress():
                print("hpcrep: warning: ULFM's heartbeat detector runs without its own thread "
                      "and MPI was not started with MPI_THREAD_MULTIPLE, so nothing makes MPI "
                      "progress while this rank computes: a busy rank can be declared dead. "
                      "Start MPI with thread level multiple (mpi4py's default).",
                      file=sys.stderr, flush=True)


def _at_exit() -> None:
    """At the exit of a survivor: wait until every survivor is exiting, let rank 0 print the
    notice that ends a launcher still waiting for a lost node's daemon
    (:data:`hpcrep.comm.abort.DONE_NOTICE`, :mod:`hpcrep.launch.supervise`), then end MPI with
    a deadline (after a failure Open MPI 5's ``MPI_Finalize`` can wait for good)."""
    try:
        if world.is_initialized() and not failed():
            world.comm().Agree(1)  # fault tolerant: returns on every living rank
            if _history and world.rank() == 0:
                lost = "; ".join(f"ranks {', '.join(map(str, r.lost))} of {r.old_size}"
                                 for r in _history)
                print(done_notice(0, lost), file=sys.stderr, flush=True)
        if not failed():
            _disconnect_links()
    except Exception:  # noqa: BLE001 - a rank lost at exit: finalize all the same
        pass
    ulfm.stop_progress()
    # a program ended by an exception (the interpreter has set sys.last_value) keeps a
    # non-zero status if MPI_Finalize has to be cut short
    ulfm.finalize(_finalize_seconds,
                  status=1 if getattr(sys, "last_value", None) is not None else 0)


def finish_sooner(seconds: float) -> None:
    """Let this process's ``MPI_Finalize`` at exit take at most ``seconds`` (default 10 s): for
    a job that stops to be relaunched (:func:`hpcrep.comm.grow.stop_to_relaunch`), where after a
    cut link it only ever waited out the deadline (10.2-10.3 s in 5 of 5 runs on the fixture).
    Local."""
    global _finalize_seconds
    _finalize_seconds = min(_finalize_seconds, seconds)


def _disconnect_links(timeout: float = 10.0) -> None:
    """If ranks were spawned to grow the job, free every communicator that holds both them and
    the ranks that spawned them (:func:`hpcrep.comm.world.shutdown`) and disconnect the links:
    Open MPI's ``MPI_Finalize`` in the spawned ranks otherwise waits (``ompi_dpm_dyn_finalize``)
    for the spawning ranks to disconnect such communicators, which those do only late in their
    own ``MPI_Finalize`` (with the detector's own thread, never: its finalize step did not
    return). A step still waiting after ``timeout`` seconds ends this process with status 0, as
    :func:`hpcrep.comm.ulfm.finalize` does."""
    if not world.has_links():
        return
    timer = threading.Timer(timeout, os._exit, (0,))
    timer.daemon = True
    timer.start()
    try:
        world.shutdown()
        world.disconnect_links()
    finally:
        timer.cancel()


def history() -> list[Recovery]:
    """Return the recoveries this rank took part in, oldest first. Local."""
    return list(_history)


world.at_init(arm)
