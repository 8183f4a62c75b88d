"""Communicators: a set of the job's ranks that hpcrep's collectives can run on.

A :class:`Communicator` holds a private MPI communicator (never the user's), its split into a
node-local communicator (ranks that share memory) and a cross-node one (one rank per node with
the same local rank), and the job ranks of its members. The job's world is one
(:func:`hpcrep.comm.world.communicator`); sync groups and Horovod process sets are others, made by
:func:`split`. Ranks passed to or returned by hpcrep are job ranks unless a method says otherwise:
:meth:`Communicator.rank` is the position inside the communicator, :meth:`Communicator.root`
turns a job rank into it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from hpcrep.errors import CollectiveArgumentError


class Communicator:
    """The ranks a collective runs on, with their private MPI communicators.

    Args:
        comm: private mpi4py communicator of the members (hpcrep's own, not the user's).
        ranks: job rank of each member, in ``comm``'s rank order.
        name: label for error messages (``"the job"``, ``"process set 2"``, ``"sync group 1"``).

    Construction is collective over ``comm`` (it splits it by node): every member must construct
    it, in the same order.
    """

    def __init__(self, comm: Any, ranks: Sequence[int], name: str) -> None:
        self.name = name
        self._at_free: list = []
        self._adopt(comm, ranks)

    def _adopt(self, comm: Any, ranks: Sequence[int]) -> None:
        """Make ``comm`` (members: job ranks ``ranks``) this communicator's, with its splits by
        node. Collective over ``comm``."""
        from mpi4py import MPI  # noqa: PLC0415 - deliberate lazy import: importing hpcrep is cheap

        if comm.Get_size() != len(ranks):
            raise CollectiveArgumentError(
                f"{self.name}: the communicator has {comm.Get_size()} ranks but {len(ranks)} job "
                f"ranks were given ({list(ranks)}); pass one job rank per member.")
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        cross = comm.Split(local.Get_rank(), comm.Get_rank())
        # The same on every member, from one allgather: how many nodes, and the most and fewest
        # ranks a node has. A hierarchical reduction pays off only with more than one node and
        # more than one rank on some node; equal nodes allow its reduce-scatter form.
        sizes = [size for leader, size in comm.allgather((local.Get_rank() == 0,
                                                          local.Get_size())) if leader]
        self.comm: Any = comm
        self.ranks: tuple[int, ...] = tuple(int(r) for r in ranks)
        self.local: Any = local
        self.cross: Any = cross
        self.nodes: int = len(sizes)
        self.widest_node: int = max(sizes)
        self.narrowest_node: int = min(sizes)

    def replace(self, comm: Any) -> None:
        """Go on with ``comm`` instead of this communicator's MPI communicators, keeping this
        object: what holds it (a traced ``tf.function``, a process set, an optimizer) then runs
        on ``comm``. For the job's world after a failed rank (:mod:`hpcrep.comm.elastic`): the
        old communicators hold a dead rank and are dropped without being freed (freeing one is
        not guaranteed to return). The members become job ranks ``0 .. comm's size - 1``.

        Collective over ``comm``: every member of it must call this.
        """
        self._adopt(comm, range(comm.Get_size()))

    def revoke(self) -> None:
        """Revoke this communicator's MPI communicators (ULFM), so that every member's pending
        and later operation on them fails at once instead of waiting for a dead rank. Local;
        an MPI without ULFM, or one already revoked, is fine."""
        for c in (self.comm, self.local, self.cross):
            if c is None:
                continue
            try:
                c.Revoke()
            except Exception:  # noqa: BLE001 - no ULFM, or revoked already: nothing to do
                pass

    def abandon(self) -> None:
        """Forget the MPI communicators without freeing them (they hold a dead rank); later use
        raises a clear error. Local."""
        self._at_free.clear()
        self.comm = self.local = self.cross = None

    def _live(self) -> Any:
        if self.comm is None:
            raise CollectiveArgumentError(
                f"{self.name} has been freed (its process set was removed, its Replicator "
                "closed, or hpcrep shut down); create a new one.")
        return self.comm

    def rank(self) -> int:
        """Return this process's rank inside the communicator (0 .. size - 1)."""
        return self._live().Get_rank()

    def size(self) -> int:
        """Return the number of ranks in the communicator."""
        return self._live().Get_size()

    def local_rank(self) -> int:
        """Return this process's rank among the communicator's ranks on its node."""
        self._live()
        return self.local.Get_rank()

    def local_size(self) -> int:
        """Return the number of the communicator's ranks on this process's node."""
        self._live()
        return self.local.Get_size()

    def cross_rank(self) -> int:
        """Return the index of this process's node among the communicator's nodes."""
        self._live()
        return self.cross.Get_rank()

    def cross_size(self) -> int:
        """Return the number of the communicator's nodes that have this process's local rank."""
        self._live()
        return self.cross.Get_size()

    def root(self, job_rank: int) -> int:
        """Return the rank inside this communicator of job rank ``job_rank``. Local.

        Raises:
            CollectiveArgumentError: ``job_rank`` is not a member.
        """
        self._live()
        try:
            return self.ranks.index(int(job_rank))
        except ValueError:
            contiguous = self.ranks == tuple(range(self.ranks[0], self.ranks[0] + len(self.ranks)))
            members = (f"{self.ranks[0]}..{self.ranks[-1]}" if contiguous and len(self.ranks) > 1
                       else str(list(self.ranks)))
            raise CollectiveArgumentError(
                f"root_rank={job_rank} is not a rank of {self.name} (job ranks {members}); pass "
                "the job rank (hvd.rank()) of a member whose values every member should "
                "receive.") from None

    def free(self) -> None:
        """Free the communicator's MPI communicators; later use raises a clear error.

        Collective: every member must call this.
        """
        if self.comm is None:
            return
        while self._at_free:
            self._at_free.pop()()
        for c in (self.cross, self.local, self.comm):
            c.Free()
        self.comm = self.local = self.cross = None

    def at_free(self, callback: Any) -> None:
        """Run ``callback`` (collective over the members) when the communicator is freed, before
        its MPI communicators are: for what other layers attach to it. Local."""
        self._at_free.append(callback)

    def __repr__(self) -> str:
        state = "" if self.comm is not None else ", freed"
        return f"Communicator({self.name}, ranks={list(self.ranks)}{state})"


def split(parent: Communicator, color: Optional[int], members: Sequence[int],
          name: str) -> Optional[Communicator]:
    """Split ``parent`` by ``color``; return this rank's new communicator (None if no color).

    Args:
        parent: the communicator to split.
        color: this rank's piece, or None to be in none of them.
        members: job ranks of this rank's piece, ascending (ignored when ``color`` is None).
        name: label of the new communicator.

    Members keep their order in ``parent``. Collective: every rank of ``parent`` must call this,
    in the same order.
    """
    from mpi4py import MPI  # noqa: PLC0415

    comm = parent.comm.Split(MPI.UNDEFINED if color is None else int(color), parent.rank())
    if color is None:
        return None
    comm.Set_name(f"hpcrep {name}")
    return Communicator(comm, members, name)
