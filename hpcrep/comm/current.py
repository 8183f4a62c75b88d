"""Which communicator a collective runs on when the caller does not say.

Every collective of :mod:`hpcrep.comm` takes ``communicator=``: a
:class:`~hpcrep.comm.communicator.Communicator`, a
:class:`~hpcrep.comm.process_sets.ProcessSet`, or None. None means :func:`current`: the
communicator of the innermost :func:`using` block of this context, or the job's world outside
any. ``using`` is how code that runs inside a group (a Replicator's sync-group step) is confined
to it without changing what :func:`hpcrep.comm.rank` and :func:`hpcrep.comm.size` mean.

The current communicator is a :class:`contextvars.ContextVar`: local to a thread (and to an
asyncio task). TensorFlow runs the host callbacks of a ``tf.function`` (``tf.numpy_function``)
on threads of its own, where no ``using`` block is active, so code that builds such callbacks
must resolve the communicator when it builds them (at trace time) and pass it down explicitly;
:mod:`hpcrep.tensorflow` does.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional

from hpcrep.comm import world
from hpcrep.comm.communicator import Communicator
from hpcrep.comm.process_sets import ProcessSet
from hpcrep.errors import CollectiveArgumentError

_current: contextvars.ContextVar[Optional[Communicator]] = contextvars.ContextVar(
    "hpcrep_communicator", default=None)


def current() -> Communicator:
    """Return the communicator collectives default to here: the innermost :func:`using`'s, or
    the job's. Local."""
    chosen = _current.get()
    return world.communicator() if chosen is None else chosen


def resolve(communicator: Any = None) -> Communicator:
    """Return the :class:`Communicator` that ``communicator`` names. Local.

    Args:
        communicator: a Communicator, a registered :class:`ProcessSet` that includes this rank,
            or None for :func:`current`.

    Raises:
        CollectiveArgumentError: a process set that is not registered or does not include this
            rank, a freed communicator, or an object of another type.
    """
    if communicator is None:
        return current()
    if isinstance(communicator, Communicator):
        communicator._live()
        return communicator
    if isinstance(communicator, ProcessSet):
        return communicator.communicator()
    raise CollectiveArgumentError(
        f"expected a process set (hvd.ProcessSet, hvd.global_process_set), an "
        f"hpcrep.comm Communicator or None for the communicator, got "
        f"{type(communicator).__name__}: {communicator!r}")


@contextlib.contextmanager
def using(communicator: Any) -> Iterator[Communicator]:
    """Make ``communicator`` (see :func:`resolve`) the default of collectives in this block.

    Affects this thread (context) only; :func:`hpcrep.comm.rank` and :func:`hpcrep.comm.size`
    still describe the job. Local: entering and leaving communicate nothing.
    """
    chosen = resolve(communicator)
    token = _current.set(chosen)
    try:
        yield chosen
    finally:
        _current.reset(token)
