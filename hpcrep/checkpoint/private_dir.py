"""Directories and files that only this user (or root) can write: made so, and checked before
a file in them is loaded (an elastic commit). Whoever can write a file that a job loads chooses
what the job loads; a directory others can write lets them replace or plant the file.

The rule (:func:`check_trusted`): the directory and the file belong to this user or root and
give no write permission to group or others. A directory that others may write but that has
the sticky bit (``/tmp``) is accepted for a file this user owns: there no one else can replace
or remove it.
"""

from __future__ import annotations

import os
import stat


def make(directory: str) -> None:
    """Create ``directory`` (and its missing parents) with mode 0700 if it does not exist; an
    existing directory is left as it is. Local."""
    os.makedirs(directory, mode=0o700, exist_ok=True)


def check_trusted(path: str, what: str, error: type[Exception], remedy: str) -> None:
    """Raise ``error`` if the file ``path`` or its directory is untrustworthy: writable by group
    or others (a sticky directory excepted, for a file this user owns), or owned by a user other
    than this one or root; ``path`` must also be a regular file. ``what`` names the file in the
    message (``"elastic commit"``), ``remedy`` adds a way out besides ``chmod``. Reads nothing
    but the two ``stat``s. Local.
    """
    me = os.geteuid()
    directory = os.path.dirname(os.path.abspath(path))
    dir_st, file_st = os.stat(directory), os.stat(path)
    problems = []
    if dir_st.st_uid not in (me, 0):
        problems.append(f"its directory {directory} belongs to uid {dir_st.st_uid}, not to you "
                        f"(uid {me}) or root")
    sticky_ok = bool(dir_st.st_mode & stat.S_ISVTX) and file_st.st_uid == me
    if dir_st.st_mode & 0o022 and not sticky_ok:
        problems.append(f"its directory {directory} is writable by {_who(dir_st.st_mode)} "
                        f"(mode {_mode(dir_st.st_mode)}), so another user may have put it there")
    if not stat.S_ISREG(file_st.st_mode):
        problems.append("it is not a regular file")
    if file_st.st_uid not in (me, 0):
        problems.append(f"it belongs to uid {file_st.st_uid}, not to you (uid {me}) or root")
    if file_st.st_mode & 0o022:
        problems.append(f"it is writable by {_who(file_st.st_mode)} "
                        f"(mode {_mode(file_st.st_mode)})")
    if problems:
        raise error(
            f"hpcrep: refusing to load the {what} {path}: {'; and '.join(problems)}. Whoever "
            "can write it decides what the job loads. Expected a file and directory owned by "
            "you (or root) that only the owner can write. Fix: chmod go-w the directory and "
            f"the file (after checking that the file is yours), or {remedy}.")


def _who(mode: int) -> str:
    return " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)


def _mode(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"
