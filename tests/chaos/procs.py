"""The processes of a trial, found in /proc by the trial's own directory on their command lines
(every command a trial starts names it), and their MPI ranks (from their environment)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Optional


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _alive(pid: str) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def processes(marker: str) -> dict[int, str]:
    """Return ``{pid: command line}`` of the living processes (zombies aside) whose command line
    contains ``marker``. Local."""
    found: dict[int, str] = {}
    me = str(os.getpid())
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == me:
            continue
        cmdline = _read(f"/proc/{entry}/cmdline")
        if cmdline and needle in cmdline and _alive(entry):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def ranks(marker: str) -> dict[int, int]:
    """Return ``{MPI rank in its launch: pid}`` of the trial's rank processes: those of
    :func:`processes` with ``OMPI_COMM_WORLD_RANK`` in their environment, Python ones only."""
    found: dict[int, int] = {}
    for pid, cmdline in processes(marker).items():
        if "python" not in cmdline.split(" ", 1)[0]:
            continue
        env = _read(f"/proc/{pid}/environ") or b""
        for item in env.split(b"\0"):
            if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                found[int(item.split(b"=", 1)[1])] = pid
    return found


def send(pid: int, signum: int) -> bool:
    """Send ``signum`` to ``pid``; return False if it is gone."""
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def orphans(marker: str, wait: float = 10.0) -> list[str]:
    """Wait up to ``wait`` seconds for every process of the trial to end; return the command
    lines of those left, then SIGKILL them so that the next trial starts clean."""
    deadline = time.monotonic() + wait
    left = processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes(marker)
    for pid in left:
        send(pid, signal.SIGKILL)
    return sorted(left.values())


def tmp_files(directory: Path) -> list[Path]:
    """The temporary files of a checkpoint or commit being written under ``directory``
    (``.NAME.tmp-PID`` of an HDF5 checkpoint, ``.NAME.XXXX.tmp`` of a commit file)."""
    found = []
    for root, _dirs, files in os.walk(directory):
        found += [Path(root, f) for f in files if f.startswith(".") and ".tmp" in f]
    return found
