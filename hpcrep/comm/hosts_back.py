"""The files through which ``hpcrep run --elastic --max-np`` and a shrunk ULFM job agree to grow
the job back onto hosts it lost (all in ``HPCREP_ELASTIC_DIR``, each written atomically).

Open MPI 5.0.11 cannot spawn ranks onto a node the job lost to a cut link and that came back
(:mod:`hpcrep.comm.grow`), so such a node rejoins through a relaunch from the last commit:

1. While the job is below its maximum size, rank 0 writes the hosts it runs on now
   (:data:`RUNNING`, :func:`publish_running`) at every commit.
2. ``hpcrep run`` probes the job's hosts that run no rank (:mod:`hpcrep.launch.heal_watch`) and
   writes those that answer again (:data:`BACK`, :func:`report_back`).
3. At its next commit the job sees them (:func:`hosts_back`), rank 0 writes :data:`RELAUNCH`
   (:func:`request_relaunch`) after the commit is on disk, and every rank exits 0.
4. ``hpcrep run`` finds :data:`RELAUNCH` (:func:`relaunch_requested`), removes the three files
   (:func:`clear`) and starts the job again on every host that answers, at up to its maximum size,
   from that commit.

Plain files and JSON only (no MPI, no TensorFlow): the launcher imports this module too.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional, Sequence

RUNNING = "hpcrep-running-hosts.json"    # rank 0: the hosts the shrunk job runs on now
BACK = "hpcrep-hosts-back.json"          # hpcrep run: hosts without ranks that answer again
RELAUNCH = "hpcrep-grow-relaunch.json"   # rank 0: the job stopped at a commit to grow


def short(name: str) -> str:
    """Return a host name without its domain (``node2.cluster`` -> ``node2``): MPI's processor
    name and the name given to ``-H`` may differ in it."""
    return name.split(".", 1)[0]


def _write(directory: str, name: str, data: dict) -> None:
    path = os.path.join(directory, name)
    os.makedirs(directory, mode=0o700, exist_ok=True)  # as the elastic commits' directory
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _read(directory: str, name: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(directory, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def publish_running(directory: str, hosts: Sequence[str]) -> None:
    """Write the hosts the job runs ranks on now (one entry per host). Rank 0 only."""
    names = sorted({short(h) for h in hosts})
    if (_read(directory, RUNNING) or {}).get("hosts") != names:
        _write(directory, RUNNING, {"hosts": names, "time": time.time()})


def running(directory: str) -> Optional[list[str]]:
    """Return the hosts a shrunk job last said it runs on, or None if it has said nothing."""
    data = _read(directory, RUNNING)
    return None if data is None else list(data.get("hosts", []))


def report_back(directory: str, hosts: Sequence[str]) -> None:
    """Write the hosts that run no rank of the job and answer the launcher again. Launcher."""
    _write(directory, BACK, {"hosts": sorted({short(h) for h in hosts}), "time": time.time()})


def hosts_back(directory: str, now: Sequence[str]) -> tuple[str, ...]:
    """Return the hosts the launcher reported back that run no rank ``now`` (short names),
    sorted. Any host of the launcher's list counts, not only those this job started on: a
    relaunch that found only some hosts must still grow onto the others when they answer.
    Local."""
    data = _read(directory, BACK) or {}
    live = {short(h) for h in now}
    return tuple(sorted({short(h) for h in data.get("hosts", [])} - live))


def request_relaunch(directory: str, hosts: Sequence[str], size: int, max_size: int) -> None:
    """Say that the job stopped at its last commit to be relaunched onto ``hosts`` (and the
    ones it ran on) at up to ``max_size`` ranks. Rank 0 only, after the commit is on disk."""
    _write(directory, RELAUNCH, {"hosts": sorted(short(h) for h in hosts), "size": size,
                                 "max_size": max_size, "time": time.time()})


def relaunch_requested(directory: str) -> Optional[dict[str, Any]]:
    """Return what :func:`request_relaunch` wrote, or None. Launcher."""
    return _read(directory, RELAUNCH)


def clear(directory: str) -> None:
    """Remove the three files (before a relaunch: the new job starts with none). Launcher."""
    for name in (RUNNING, BACK, RELAUNCH):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
