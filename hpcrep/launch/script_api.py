"""Does a script use the explicit API, or know its rank? Read from its source, without running it.

``hpcrep run`` runs a script in transparent mode only when it does not already distribute its
own training: transparent mode would average the gradients of ``hvd.DistributedOptimizer`` a
second time. A script is explicit when it imports (anywhere: at the top, inside a function or an
``if``) one of :data:`EXPLICIT_MODULES` or a module below one, by ``import``, ``from ... import``
or ``importlib.import_module``/``__import__`` with a literal name. ``hpcrep.comm`` alone (numpy
collectives) does not count. A script *knows its rank* when it imports hpcrep, mpi4py or Horovod
in any of these ways, or names a launcher's rank variable (:data:`RANK_VARIABLES`) in a string;
transparent mode leaves the files such a script writes to it
(:mod:`hpcrep.tensorflow.transparent.own_files`). Pure: reads the file, imports nothing.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Iterable

from hpcrep.errors import LaunchOptionError

# Modules whose import makes a script explicit (and what importing them means).
EXPLICIT_MODULES: dict[str, str] = {
    "hpcrep.tensorflow": "hpcrep's Horovod-compatible API",
    "hpcrep.keras": "hpcrep's Keras API",
    "horovod": "Horovod's API",
}

# Modules whose import lets a script learn its rank (or communicate).
RANK_MODULES = ("hpcrep", "mpi4py", "horovod")
# Environment variables that hold a process's rank under Open MPI, MPICH, PMIx and Slurm.
RANK_VARIABLES = frozenset({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
                            "MV2_COMM_WORLD_RANK"})


@dataclasses.dataclass(frozen=True)
class ExplicitImport:
    """One import that makes a script explicit: the module and the line it is on."""

    module: str
    line: int


def _under(module: str, roots: Iterable[str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in roots)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


def explicit_imports(source: str, filename: str = "<script>") -> list[ExplicitImport]:
    """Return the imports in ``source`` that make it explicit, in source order (empty: none).

    Raises:
        LaunchOptionError: ``source`` is not valid Python.
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        raise LaunchOptionError(
            f"cannot read {filename} to choose the mode (line {exc.lineno}: {exc.msg}); fix it, "
            "or choose with --transparent / --no-transparent") from None
    found = []
    for node in ast.walk(tree):
        for module in _imported(node):
            if _under(module, EXPLICIT_MODULES):
                found.append(ExplicitImport(module, node.lineno))
                break
    return sorted(found, key=lambda f: f.line)


def script_imports(path: str) -> list[ExplicitImport]:
    """Return :func:`explicit_imports` of the script at ``path``.

    Raises:
        LaunchOptionError: no such file, or it is not valid Python.
    """
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as exc:
        raise LaunchOptionError(f"no script {path!r} ({exc.strerror})") from None
    return explicit_imports(source, path)


def uses_horovod(found: list[ExplicitImport]) -> bool:
    """Return True if any of ``found`` imports Horovod's own modules."""
    return any(f.module == "horovod" or f.module.startswith("horovod.") for f in found)


def knows_rank(source: str, filename: str = "<script>") -> bool:
    """Return True if the script in ``source`` can learn its rank: it imports one of
    :data:`RANK_MODULES` (or a module below one), or a string in it is one of
    :data:`RANK_VARIABLES`. A script that is not valid Python does not (it fails when it runs)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return False
    return any((isinstance(node, ast.Constant) and node.value in RANK_VARIABLES)
               or any(_under(module, RANK_MODULES) for module in _imported(node))
               for node in ast.walk(tree))


def script_knows_rank(path: str) -> bool:
    """Return :func:`knows_rank` of the script at ``path`` (False if it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return knows_rank(f.read(), path)
    except OSError:
        return False
