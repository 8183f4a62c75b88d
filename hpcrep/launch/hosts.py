"""Where ``hpcrep run`` places ranks: host lists as horovodrun takes them, in this MPI's syntax.

``-H host1:2,host2:2`` and ``--hostfile FILE`` become one list of :class:`Host` (name, slots),
checked against the number of ranks, then written as the MPI wants it: Open MPI
``--host host1:2,host2:2``, MPICH (Hydra) ``-hosts host1:2,host2:2``. A host without a slot count
has 1 slot, as in horovodrun. Pure functions; nothing here communicates.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Sequence

from hpcrep.errors import LaunchOptionError

_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")


@dataclasses.dataclass(frozen=True)
class Host:
    """One host and how many ranks it may run."""

    name: str
    slots: int


def _host(name: str, slots_text: Optional[str], where: str) -> Host:
    if not name or not _NAME.match(name):
        raise LaunchOptionError(f"{where}: {name!r} is not a host name")
    if slots_text is None:
        return Host(name, 1)
    try:
        slots = int(slots_text)
    except ValueError:
        slots = 0
    if slots < 1:
        raise LaunchOptionError(f"{where}: host {name!r} has slots {slots_text!r}; expected a "
                                "whole number of at least 1")
    return Host(name, slots)


def parse_hosts(text: str) -> list[Host]:
    """Return the hosts of a horovodrun ``-H`` value: ``host1:2,host2:2`` (``host`` alone: 1 slot).

    Raises:
        LaunchOptionError: an empty entry, a bad name or a slot count below 1.
    """
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise LaunchOptionError(f"-H {text!r}: empty host entry; expected host1:2,host2:2")
        name, _, slots = entry.rpartition(":") if ":" in entry else (entry, "", None)
        hosts.append(_host(name, slots, f"-H {text!r}"))
    return hosts


def parse_hostfile(text: str, path: str = "hostfile") -> list[Host]:
    """Return the hosts of a hostfile's ``text``: one host a line, as horovodrun
    (``host slots=N``) or Open MPI (``host slots=N max_slots=M``; ``max_slots`` is ignored) or
    MPICH (``host:N``) write them. ``#`` starts a comment; a host alone has 1 slot.

    Raises:
        LaunchOptionError: a line that is none of these (its number is in the message), or no
            host at all.
    """
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path} line {number}"
        slots: Optional[str] = None
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if not eq:
                raise LaunchOptionError(f"{where}: {line.strip()!r}; expected 'host slots=N'")
            if key == "slots":
                slots = value
        name = words[0]
        if ":" in name and slots is None:
            name, slots = name.rsplit(":", 1)
        hosts.append(_host(name, slots, where))
    if not hosts:
        raise LaunchOptionError(f"{path}: no hosts in the file; expected lines 'host slots=N'")
    return hosts


def read_hostfile(path: str) -> list[Host]:
    """Return the hosts of the hostfile at ``path`` (:func:`parse_hostfile`).

    Raises:
        LaunchOptionError: the file cannot be read, or does not parse.
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise LaunchOptionError(f"--hostfile {path}: cannot read it ({exc.strerror})") from None
    return parse_hostfile(text, path)


def check_ranks(np: Optional[int], hosts: Sequence[Host], given: str) -> int:
    """Return the number of ranks to start on ``hosts``: ``np``, or all their slots if None.

    ``given`` says where the hosts came from (``-H a:2,b:2``), for the message.

    Raises:
        LaunchOptionError: ``np`` is more than the hosts' slots.
    """
    slots = sum(h.slots for h in hosts)
    if np is None:
        return slots
    if np > slots:
        raise LaunchOptionError(
            f"-np {np} asks for more ranks than the {slots} slots of {given}; give -np {slots} "
            "or less, or more slots")
    return np


def host_arguments(hosts: Sequence[Host], mpi_family: str) -> list[str]:
    """Return the arguments that place ranks on ``hosts`` for ``mpi_family`` (as
    :func:`hpcrep.launch.mpirun.flavor` names it): MPICH ``-hosts``, else Open MPI ``--host``."""
    listed = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    return ["-hosts", listed] if mpi_family == "mpich" else ["--host", listed]
