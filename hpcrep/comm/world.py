"""The MPI world hpcrep runs in: initialisation, ranks and the private communicators.

hpcrep never talks on the user's communicator. :func:`init` duplicates ``COMM_WORLD`` (or the
communicator given) once into the job's :class:`~hpcrep.comm.communicator.Communicator`, which
splits the duplicate into a node-local and a cross-node communicator. :func:`rank`, :func:`size`
and the topology functions always describe the job; collectives run on the job unless given
another communicator (see :mod:`hpcrep.comm.current`).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hpcrep import config, config_check
from hpcrep.comm import watchdog
from hpcrep.comm.abort import abort as abort_job
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.yield_policy import yield_if_oversubscribed
from hpcrep.errors import ConfigError, NotInitializedError

_world: Optional[Communicator] = None
_at_shutdown: list[Callable[[], None]] = []
_at_replace: list[Callable[[], None]] = []
_at_init: list[Callable[[], None]] = []
_links: list[Any] = []  # intercommunicators to ranks spawned to grow the job, oldest first
_lock = threading.RLock()
GROW_CHILD_ENV = "HPCREP_GROW_CHILD"  # set on ranks spawned to grow a job (hpcrep.comm.grow)
if os.environ.get(GROW_CHILD_ENV):
    # Before MPI starts in a rank spawned to grow a job: Open MPI 5.0.11's heartbeat detector
    # watches each job's own COMM_WORLD only (not the merged world), and in a spawned job it
    # kept MPI_Finalize from returning (ompi_comm_failure_detector_finalize spun for good).
    os.environ["OMPI_MCA_mpi_ft_detector"] = "false"
yield_if_oversubscribed(os.environ)  # before MPI starts: waiting ranks yield on a crowded node


def _mpi() -> Any:
    """Import mpi4py.MPI (which initialises MPI with thread level 'multiple' if needed)."""
    from mpi4py import MPI  # noqa: PLC0415 - deliberate lazy import: importing hpcrep is cheap

    return MPI


def init(comm: Any = None) -> None:
    """Initialise hpcrep on ``comm`` (default ``MPI.COMM_WORLD``); a second call does nothing.

    Args:
        comm: an mpi4py communicator, or a list of world ranks to run on (as in Horovod); ranks
            not in the list get a world of their own of size 1.

    Collective: every rank of ``comm`` (or of ``COMM_WORLD`` when a rank list is given) must call
    this.

    Raises:
        SettingsError: (on each rank whose environment has them, before MPI starts) misspelt
            ``HPCREP_*`` names, values that do not parse or are out of range, or (rank 0) a
            directory setting it cannot write; the message has one line per problem
            (:mod:`hpcrep.config_check`).
        ConfigError: (on every rank) the ranks disagree on a setting that must be the same on
            all of them (``same_on_all_ranks`` in :mod:`hpcrep.config`), or such a setting has
            a value that does not parse.
    """
    global _world
    with _lock:
        if _world is not None:
            return
        # local, before MPI starts; a rank spawned to grow a job writes no directories
        config_check.check_environment(directories=not spawned_to_grow())
        MPI = _mpi()
        if not MPI.Is_initialized():  # mpi4py.rc.initialize was off (native.build.running_mpi)
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        parent = MPI.COMM_WORLD if comm is None else comm
        if isinstance(comm, Sequence):
            ranks = [int(r) for r in comm]
            world = MPI.COMM_WORLD
            color = 0 if world.Get_rank() in ranks else 1
            key = ranks.index(world.Get_rank()) if color == 0 else world.Get_rank()
            parent = world.Split(color, key)
        if comm is None and spawned_to_grow():
            private = _join_parent(MPI)  # the running ranks' job.replace() is the other half
        else:
            private = parent.Dup()
            try:
                check_settings(private)
            except ConfigError:
                private.Free()  # every rank raises here, so every rank frees it
                raise
        private.Set_name("hpcrep")
        _world = Communicator(private, range(private.Get_size()), "the job")
        watchdog.attach(private)
        for callback in list(_at_init):
            callback()


def spawned_to_grow() -> bool:
    """Return True if this process was spawned by a running job to grow it
    (:mod:`hpcrep.comm.grow`): its :func:`init` joins that job instead of starting one. Local."""
    return bool(os.environ.get(GROW_CHILD_ENV))


def _join_parent(MPI: Any) -> Any:
    """Merge with the job that spawned this process (after its ranks, in spawn order) and
    return the merged communicator; remember the link for :func:`disconnect_links`.

    Collective with the spawning ranks' :func:`hpcrep.comm.grow.grow`, which makes the same
    merged communicator the job's world with :func:`replace` (the same collectives as this
    process's :class:`Communicator` and watchdog set-up)."""
    link = MPI.Comm.Get_parent()
    if link == MPI.COMM_NULL:
        raise NotInitializedError(
            f"{GROW_CHILD_ENV} is set but this process was not spawned by an MPI job; unset it "
            "(hpcrep sets it only on the ranks it spawns to grow a job).")
    link.Set_errhandler(MPI.ERRORS_RETURN)
    merged = link.Merge(high=True)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    add_link(link)
    return merged


def add_link(link: Any) -> None:
    """Remember ``link``, an intercommunicator between this job's ranks and ranks spawned to grow
    it, to be disconnected at exit (:func:`disconnect_links`). Local."""
    with _lock:
        _links.append(link)


def has_links() -> bool:
    """Return True if this job has links to ranks spawned to grow it (this rank spawned some,
    or was spawned). Local."""
    return bool(_links)


def drop_links() -> None:
    """Forget the links to spawned ranks without disconnecting them (after a failed rank: a
    disconnect waits for every member). Local."""
    with _lock:
        _links.clear()


def disconnect_links() -> None:
    """Disconnect every link to spawned ranks, oldest first: Open MPI's ``MPI_Finalize`` of
    spawned ranks waits for the job that spawned them unless they are disconnected.

    Collective: every rank of the job must call it, at exit (:mod:`hpcrep.comm.recovery`)."""
    with _lock:
        links, _links[:] = list(_links), []
    for link in links:
        link.Disconnect()


def check_settings(comm: Any) -> None:
    """Raise :class:`ConfigError` on every rank unless all ranks hold the same parsed values of
    the settings marked ``same_on_all_ranks``.

    One 16-byte MAX allreduce of ``[d, -d]`` (``d``: the digest of this rank's values); only
    when the digests differ do the ranks gather their values, to say which differ where.

    Collective: every rank of ``comm`` must call this.
    """
    MPI = _mpi()
    mine = config.agreed_values()
    d = config.digest(mine)
    both = np.array([d, -d], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    if int(both[0]) != -int(both[1]):
        problem = config.disagreement(comm.allgather(mine))
        raise ConfigError(problem or "hpcrep settings that must be the same on every rank "
                          "differ between ranks; compare the HPCREP_* variables of the ranks.")
    config.require_valid(mine)


def shutdown() -> None:
    """Free hpcrep's communicators. After this, :func:`init` may be called again.

    Collective: every rank that called :func:`init` must call this.
    """
    global _world
    with _lock:
        if _world is None:
            return
        while _at_shutdown:
            _at_shutdown.pop()()
        watchdog.detach()
        _world.free()
        _world = None


def at_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback`` at the next :func:`shutdown`, before the job's communicators are freed.

    For modules that build communicators on the job's (process sets): the callback frees them.
    Callbacks run last-registered first, once. Local.
    """
    with _lock:
        _at_shutdown.append(callback)


def at_init(callback: Callable[[], None]) -> None:
    """Run ``callback`` at the end of every :func:`init` (and now, if initialised already): for
    modules above this one that set something up per job (:mod:`hpcrep.comm.recovery`'s exit
    hook). Local."""
    with _lock:
        _at_init.append(callback)
        initialised = _world is not None
    if initialised:
        callback()


def at_replace(callback: Callable[[], None]) -> None:
    """Run ``callback`` each time the job's world is replaced by its survivors
    (:func:`replace`), before the new communicators are made: for modules that hold
    communicators built on the old world (process sets), which must drop them without freeing
    them. Local; callbacks run last-registered first and stay registered.
    """
    with _lock:
        if callback not in _at_replace:
            _at_replace.append(callback)


def replace(new_comm: Any) -> Communicator:
    """Make ``new_comm`` (the survivors of a failed rank, from :func:`hpcrep.comm.ulfm.shrink`)
    the job's world, in place: :func:`rank`, :func:`size` and the topology describe the
    survivors from now on, and everything that holds the job's :class:`Communicator` (traced
    functions, optimizers) runs on them. Process sets are dropped (:func:`at_replace`), the
    stall watchdog watches the new world, and the old communicators are not freed (they hold
    the dead rank). Returns the job's communicator.

    Collective over ``new_comm``: every survivor must call this, after the shrink.
    """
    with _lock:
        world = _require()
        for callback in reversed(_at_replace):
            callback()
        watchdog.detach(free=False)
        new_comm.Set_name("hpcrep")
        world.replace(new_comm)
        watchdog.attach(new_comm)
        return world


def is_initialized() -> bool:
    """Return True if :func:`init` has been called (and not undone by :func:`shutdown`)."""
    return _world is not None


def _require() -> Communicator:
    if _world is None:
        raise NotInitializedError(
            "hpcrep has not been initialized: call hpcrep.comm.init() (or hvd.init()) before "
            "asking for ranks or running collectives.")
    return _world


def communicator() -> Communicator:
    """Return the job's communicator: every rank hpcrep was initialised on."""
    return _require()


def comm() -> Any:
    """Return hpcrep's private duplicate of the job's MPI communicator (mpi4py)."""
    return _require().comm


def rank() -> int:
    """Return this process's rank in the job (never a group's or a process set's rank)."""
    return _require().rank()


def size() -> int:
    """Return the number of ranks in the job."""
    return _require().size()


def local_rank() -> int:
    """Return this process's rank among the ranks on its node."""
    return _require().local_rank()


def local_size() -> int:
    """Return the number of ranks on this process's node."""
    return _require().local_size()


def cross_rank() -> int:
    """Return the index of this process's node among the nodes (ranks with its local rank)."""
    return _require().cross_rank()


def cross_size() -> int:
    """Return the number of nodes that have a rank with this process's local rank."""
    return _require().cross_size()


def is_homogeneous() -> bool:
    """Return True if every node runs the same number of ranks.

    Local: the job's communicator learnt every node's size when it was made.
    """
    w = _require()
    return w.widest_node == w.narrowest_node


def mpi_threads_supported() -> bool:
    """Return True if MPI was initialised with ``MPI_THREAD_MULTIPLE``."""
    MPI = _mpi()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_library_version() -> str:
    """Return the first line of the MPI library's version string. Local; callable before
    ``init()`` (MPI allows ``MPI_Get_library_version`` before ``MPI_Init``)."""
    return _mpi().Get_library_version().replace("\0", "").strip().splitlines()[0]


def mpi_flavour(version: Optional[str] = None) -> str:
    """Return a short name for the MPI library's binary interface, e.g. ``openmpi4``,
    ``openmpi5``, ``mpich4``: code compiled against one flavour is loaded only under the same one
    (Open MPI 4 and 5 are not binary compatible). ``version`` is a first line of
    ``MPI_Get_library_version`` (default: the running library's). Local."""
    line = mpi_library_version() if version is None else version
    for pattern, name in ((r"Open MPI v(\d+)", "openmpi"), (r"MPICH Version:\s*(\d+)", "mpich"),
                          (r"Intel\(R\) MPI Library (\d+)", "intelmpi"),
                          (r"MVAPICH2? Version\s*:?\s*(\d+)", "mvapich")):
        found = re.search(pattern, line)
        if found:
            return f"{name}{found.group(1)}"
    return "mpi-" + hashlib.sha256(line.encode()).hexdigest()[:8]


def abort(errorcode: int = 1) -> None:
    """Abort every rank of the job (``MPI_Abort`` on ``COMM_WORLD``), first printing the notice
    that hpcrep's launchers watch for (:mod:`hpcrep.comm.abort`). Does not return. Local."""
    abort_job(errorcode)
