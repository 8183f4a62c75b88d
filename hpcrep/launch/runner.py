"""Run a Python script (or module) on this rank as ``python script.py`` would; abort on failure.

The model is mpi4py's ``mpi4py.run``: an unhandled exception on any rank must not leave the other
ranks waiting forever in a collective. So the failing rank prints its rank and traceback, then
calls ``MPI_Abort`` on ``COMM_WORLD``, which takes every rank down with a non-zero exit. A script
that ends normally, or calls ``sys.exit(0)`` / ``sys.exit()``, returns 0; ``sys.exit(n)`` with
``n != 0`` aborts every rank with code ``n``.

This module knows nothing of TensorFlow: the caller passes the context (transparent mode) that the
script runs in.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import runpy
import socket
import sys
import traceback
from typing import Callable, ContextManager, Iterable, Optional, Sequence

USAGE = "usage: python -m hpcrep script.py [args ...] | -m module [args ...]"


def execute(target: Sequence[str]) -> None:
    """Run ``target`` (``[script, *args]`` or ``["-m", module, *args]``) as ``__main__``.

    Sets ``sys.argv`` and ``sys.path[0]`` as the ``python`` command does. Local.

    Raises:
        SystemExit: ``target`` is empty or names no script (code 2), or the script exited.
    """
    target = list(target)
    if target[:1] == ["-m"]:
        if len(target) < 2:
            raise SystemExit(USAGE)
        sys.argv = [target[1], *target[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        return
    if not target or target[0].startswith("-"):
        raise SystemExit(USAGE)
    path = target[0]
    if not os.path.exists(path):
        raise FileNotFoundError(f"python -m hpcrep: no script {path!r} (cwd {os.getcwd()})")
    sys.argv = [path, *target[1:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def script_file(target: Sequence[str]) -> Optional[str]:
    """Return the file :func:`execute` would run for ``target``: the script's path as given, or
    the module's (a package's ``__main__``), found without importing anything; None if there is
    none. Local."""
    target = list(target)
    if target[:1] != ["-m"]:
        found = target[0] if target and not target[0].startswith("-") else None
        return found if found is not None and os.path.isfile(found) else None
    if len(target) < 2:
        return None
    spec = _find_spec(target[1])
    if spec is not None and spec.submodule_search_locations is not None:  # runs its __main__
        spec = _find_spec(f"{target[1]}.__main__")
    return spec.origin if spec is not None and spec.has_location else None


def _find_spec(name: str) -> Optional[importlib.machinery.ModuleSpec]:
    parts, spec = name.split("."), None
    path: Optional[Iterable[str]] = [os.getcwd(), *sys.path]  # runs as python -m would
    for i in range(len(parts)):
        if path is None:  # a module has no submodules
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def _world() -> tuple[int, int]:
    import hpcrep.comm.world  # noqa: PLC0415, F401 - what must be set before MPI starts
    from mpi4py import MPI  # noqa: PLC0415 - MPI only when a script runs

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def abort_job(code: int, message: str) -> None:
    """Print ``message`` and the current traceback to stderr, then abort every rank; in a job
    with fault tolerance on (ULFM), end this rank alone as a failed one instead when the failure
    is the script's own, so that the others can go on
    (:func:`hpcrep.comm.recovery.leave_as_failed`). No return."""
    rank, size = _world()
    sys.stdout.flush()
    from hpcrep.comm import recovery, ulfm  # noqa: PLC0415

    if ulfm.ft_enabled() and recovery.is_own_failure(sys.exc_info()[1]):
        print(f"hpcrep: rank {rank} of {size} on {socket.gethostname()} {message}.",
              file=sys.stderr)
        if sys.exc_info()[0] is not None:
            traceback.print_exc(file=sys.stderr)
        recovery.leave_as_failed(f"hpcrep: rank {rank} leaves the fault-tolerant job as a "
                                 "failed rank, so that the others go on (elastic) or end")
    print(f"hpcrep: rank {rank} of {size} on {socket.gethostname()} {message}; aborting all "
          f"{size} ranks (MPI_Abort, exit code {code}).", file=sys.stderr)
    if sys.exc_info()[0] is not None:
        traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()
    from hpcrep.comm.world import abort  # noqa: PLC0415

    abort(code)


def main(argv: Optional[Sequence[str]] = None,
         context: Callable[[], ContextManager] = contextlib.nullcontext) -> int:
    """Run the script in ``argv`` inside ``context()``; return 0 or abort the job.

    Collective in effect: every rank runs the same script.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        with context():
            execute(argv)
    except SystemExit as exc:
        code = exc.code
        if code is None or code == 0:
            return 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        abort_job(code, f"called sys.exit({code})")
    except BaseException:  # noqa: BLE001 - any failure, KeyboardInterrupt included, aborts
        abort_job(1, "raised an unhandled exception")
    return 0
