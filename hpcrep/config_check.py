"""Check every ``HPCREP_*`` variable of an environment at once, before MPI and TensorFlow start.

:func:`problems` returns one line per problem: a name that is no setting (with the setting it
was probably meant to be), a value that does not parse as its setting's type, a value outside
its setting's :class:`~hpcrep.config.Range`. :func:`directory_problems` creates the directories
rank 0 writes to (``HPCREP_CHECKPOINT_DIR``, ``HPCREP_ELASTIC_DIR``) and checks that it can
write there. :func:`check_environment` raises both as one :class:`~hpcrep.errors.SettingsError`
(for :func:`hpcrep.comm.init`); :func:`exit_on_problems` prints them, ``hpcrep: `` first, and
exits with status 2 (for the ``hpcrep`` commands). Each process checks its own environment:
nothing here communicates, so a rank with a bad setting stops without waiting for the others.

This never changes what :func:`hpcrep.config.get` returns at run time.
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from typing import Mapping, Optional, TextIO

from hpcrep import config
from hpcrep.errors import SettingsError

PREFIX = "HPCREP_"
EXIT_CODE = 2  # as argparse exits on a bad command line

# Directory settings: what rank 0 writes there, and what leaving the setting unset means.
# What is written there, how to do without, and the mode a missing directory is created with:
# an elastic commit is loaded only from a directory no one else can write
# (hpcrep.checkpoint.private_dir), so that one is made private as the commit would make it.
DIRECTORIES: dict[str, tuple[str, str, int]] = {
    "HPCREP_CHECKPOINT_DIR": ("rank 0 saves checkpoints there",
                              "unset it to train without checkpoints", 0o777),
    "HPCREP_ELASTIC_DIR": ("rank 0 writes each elastic commit there",
                           "unset it to keep commits in memory only", 0o700),
}

# Launcher variables that hold this process's rank before MPI starts, most specific first
# (under mpirun inside a Slurm allocation every rank sees SLURM_PROCID=0).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def _unknown(name: str) -> str:
    known = [n[len(PREFIX):] for n in config.SETTINGS]
    close = difflib.get_close_matches(name[len(PREFIX):].upper(), known, n=1)
    guess = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
    return (f"{name} is not an hpcrep setting{guess}, so it would be ignored. Correct the name "
            "or unset it; `python -m hpcrep.config` lists every setting.")


def _value(setting: config.Setting, raw: str) -> str:
    """Return the problem with ``raw`` as the value of ``setting``, or ``''``."""
    fix = f"Set a legal value, or unset it for the default ({setting.default!r})."
    legal = setting.legal
    try:
        value = setting.parse(raw)
    except (ValueError, OverflowError) as exc:
        if setting.parse in (int, float) or isinstance(exc, OverflowError):
            # the builtins' own words ("invalid literal for int()") name nothing to set
            kind = "a whole number" if setting.parse is int else "a finite number"
            why = f"expected {legal.expected if legal else kind}; got {raw!r}"
        else:
            why = str(exc)
        return f"{setting.name}={raw!r} does not parse: {why}. {fix}"
    if legal is not None and not legal.holds(value):
        return (f"{setting.name}={raw!r} is out of range: expected {legal.expected}; got "
                f"{value!r}. {fix}")
    return ""


def problems(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Return one line per problem with the ``HPCREP_*`` variables of ``environ`` (default
    ``os.environ``), in name order: unknown names, values that do not parse or are out of
    range. Variables of the checkout's tools (:data:`hpcrep.config.TOOL_VARIABLES`) pass.
    Local."""
    environ = os.environ if environ is None else environ
    found = []
    for name in sorted(n for n in environ if n.startswith(PREFIX)):
        if name in config.TOOL_VARIABLES:
            continue
        setting = config.SETTINGS.get(name)
        line = _value(setting, environ[name]) if setting else _unknown(name)
        if line:
            found.append(line)
    return found


def _directory(name: str, path: str) -> str:
    """Create ``path`` if missing and write a file in it; return what failed, or ``''``."""
    what, unset, mode = DIRECTORIES[name]
    if os.path.exists(path) and not os.path.isdir(path):
        why = "it exists and is not a directory"
    else:
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                return ""
        except OSError as exc:
            why = f"this process cannot write there ({exc.strerror or exc})"
    return (f"{name}={path!r} cannot be used: {why}; {what}. Point it at a directory this "
            f"process can write (it is created if missing), or {unset}.")


def directory_problems(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """Create each directory of :data:`DIRECTORIES` set in ``environ`` (default ``os.environ``)
    and return one line per one that is not a directory or not writable. Local: call it only
    where the directory is written (rank 0; :func:`launcher_rank`)."""
    environ = os.environ if environ is None else environ
    found = []
    for name in DIRECTORIES:
        path = environ.get(name, "")
        line = _directory(name, path) if path else ""
        if line:
            found.append(line)
    return found


def launcher_rank(environ: Optional[Mapping[str, str]] = None) -> int:
    """Return this process's rank as its launcher set it in ``environ`` (default
    ``os.environ``) before MPI starts, or 0 when no launcher set one (a single process).
    Local."""
    environ = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        text = environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return 0


def all_problems(environ: Optional[Mapping[str, str]] = None,
                 directories: bool = True) -> list[str]:
    """Return :func:`problems`, and on rank 0 (:func:`launcher_rank`) also
    :func:`directory_problems` when ``directories``. Local."""
    environ = os.environ if environ is None else environ
    found = problems(environ)
    if directories and launcher_rank(environ) == 0:
        found += directory_problems(environ)
    return found


def check_environment(environ: Optional[Mapping[str, str]] = None,
                      directories: bool = True) -> None:
    """Raise :class:`SettingsError` listing :func:`all_problems`, if there are any. Local:
    every rank checks its own environment, before MPI starts.

    Raises:
        SettingsError: with one line per problem in ``problems`` and in its message.
    """
    found = all_problems(environ, directories)
    if found:
        raise SettingsError(found)


def report(found: list[str], out: Optional[TextIO] = None) -> None:
    """Print each line of ``found`` to ``out`` (default stderr), ``hpcrep: `` first, in one
    write (so that a launcher does not interleave them with another rank's). Local."""
    out = sys.stderr if out is None else out
    out.write("".join(f"hpcrep: {line}\n" for line in found))
    out.flush()


def exit_on_problems(environ: Optional[Mapping[str, str]] = None,
                     directories: bool = True) -> None:
    """Check as :func:`check_environment` does; on problems print them (:func:`report`) and
    exit with status 2, no traceback. For programs, never for a library. Local."""
    try:
        check_environment(environ, directories)
    except SettingsError as exc:
        report(exc.problems)
        raise SystemExit(EXIT_CODE) from None
