"""Does a script use the explicit API? Read from its source, without running it.

``hpcrep run`` runs a script in transparent mode only when it does not already distribute its
own training: transparent mode would average the gradients of ``hvd.DistributedOptimizer`` a
second time. A script is explicit when it imports (anywhere: at the top, inside a function or an
``if``) one of :data:`EXPLICIT_MODULES` or a module below one, by ``import``, ``from ... import``
or ``importlib.import_module``/``__import__`` with a literal name. ``hpcrep.comm`` alone (numpy
collectives) does not count. Pure: reads the file, imports nothing.
"""

from __future__ import annotations

import ast
import dataclasses

from hpcrep.errors import LaunchOptionError

# Modules whose import makes a script explicit (and what importing them means).
EXPLICIT_MODULES: dict[str, str] = {
    "hpcrep.tensorflow": "hpcrep's Horovod-compatible API",
    "hpcrep.keras": "hpcrep's Keras API",
    "horovod": "Horovod's API",
}


@dataclasses.dataclass(frozen=True)
class ExplicitImport:
    """One import that makes a script explicit: the module and the line it is on."""

    module: str
    line: int


def _explicit(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in EXPLICIT_MODULES)


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
            if _explicit(module):
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
