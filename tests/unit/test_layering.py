"""The layering of ../shared/DESIGN.md, checked on the source: a lower layer never imports a
higher one, at module level, inside functions, or by name through importlib.

- hpcrep/comm (MPI + numpy) never imports TensorFlow or Keras;
- hpcrep/tensorflow never imports hpcrep.replicator (the layer above it);
- hpcrep/checkpoint never imports hpcrep.launch: Slurm questions (job id, requeue) go to
  hpcrep.slurm, the one package that knows Slurm; and hpcrep/slurm imports neither hpcrep.launch
  nor hpcrep.checkpoint, which ask it;
- nothing under hpcrep/ imports the top-level benchmark (bench) or workloads (jobs);
- no import cycles among the modules of one package (:func:`package_cycles`);
- no module uses another package's private names (:func:`private_uses`).

Import cycles: the graph has an edge from module A to module B when A imports B anywhere (at
module level, inside a function, or under ``if TYPE_CHECKING``: a lazy import hides a cycle from
the interpreter, not from the reader), with ``from P import name`` pointing at the submodule
``P.name`` when there is one and at ``P`` (its ``__init__``) otherwise; the implicit import of
a module's parent packages is not an edge (every submodule would form a cycle with its
``__init__``), and neither are module names in strings (dispatch tables). Only edges between
modules of the same package (one directory: its ``__init__`` and its ``.py`` files) count; an
edge across packages is a layering question, for RULES. Each cycle is reported as a path.

Private names: a name with one leading underscore (``_x``, not ``__x__``) that lives in another
package than the importer's: ``from hpcrep.p.m import _x``, ``m._x`` or ``hpcrep.p.m._x`` through
an imported module, or a private module ``hpcrep.p._m`` imported from outside ``hpcrep.p``. The
importer's package is the directory of its file; "another package" includes parents and
subpackages (a private name is for the modules beside it). A private module or subpackage is the
one exception: it serves its whole holding package, subpackages included (Horovod's pattern:
``hpcrep.tensorflow._keras`` holds the implementation behind the thin public faces
``hpcrep.tensorflow.keras`` and the modules of ``hpcrep.tensorflow.transparent``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, Optional

import hpcrep

HPCREP = Path(hpcrep.__file__).resolve().parent  # the package under test

# (folder under hpcrep/, forbidden top-level names, why)
RULES = [
    ("comm", ("tensorflow", "keras", "tf_keras"), "hpcrep/comm is MPI + numpy only"),
    ("tensorflow", ("hpcrep.replicator",), "hpcrep/replicator sits above hpcrep/tensorflow"),
    ("checkpoint", ("hpcrep.launch",), "hpcrep/checkpoint asks hpcrep.slurm about Slurm"),
    ("slurm", ("hpcrep.launch", "hpcrep.checkpoint"),
     "hpcrep/slurm is asked by launch and checkpoint, never the other way"),
    ("", ("bench", "jobs"), "the product never reaches into the benchmark or the workloads"),
]

# Violations that exist today, each with the issue that removes it. The test fails both when a
# new violation appears and when one of these is gone (then delete it here). Keys as the
# checks give them: (file, forbidden root) for RULES, (file, "private NAME") for private names,
# (package, "cycle A -> B -> A") for import cycles.
KNOWN: dict[tuple[str, str], str] = {}

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def imported_names(path: Path, package: str = "") -> set[str]:
    """Every module ``path`` (a module of ``package``) imports: import statements anywhere
    (relative ones resolved), ``importlib.import_module``/``__import__`` with a literal name, and
    dotted string literals (the tables of module names that a dispatcher hands to importlib)."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_NAME.match(node.value) and "." in node.value:
                names.add(node.value)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = ast.unparse(node.func)
            if func.endswith("import_module") or func == "__import__":
                names.add(str(node.args[0].value))
    return names


def violations() -> dict[tuple[str, str], str]:
    """(file under hpcrep/, forbidden name) -> the rule's reason, for every import that breaks a
    rule."""
    found = {}
    for folder, forbidden, reason in RULES:
        for path in sorted((HPCREP / folder).rglob("*.py")):
            package = ".".join(path.relative_to(HPCREP.parent).parts[:-1])
            for name in imported_names(path, package):
                for root in forbidden:
                    if name == root or name.startswith(root + "."):
                        found[(path.relative_to(HPCREP).as_posix(), root)] = reason
    return found


def test_no_layer_imports_a_layer_above_it():
    """No file under hpcrep/ breaks a rule of RULES, except the KNOWN ones."""
    found = violations()
    new = set(found) - set(KNOWN)
    assert not new, "layering broken: " + "; ".join(
        f"hpcrep/{file} imports {root} ({found[file, root]})" for file, root in sorted(new))


def test_known_violations_are_still_there():
    """Every KNOWN violation still exists (a fixed one must leave the table)."""
    gone = set(KNOWN) - set(violations()) - set(problems())
    assert not gone, f"fixed, so remove from KNOWN: {sorted(gone)}"


def test_the_scanner_sees_imports_inside_functions_and_through_importlib(tmp_path):
    """The RULES scanner sees lazy imports, importlib calls and module names in tables."""
    module = tmp_path / "m.py"
    module.write_text("import importlib\n"
                      "def f():\n    import keras.layers\n"
                      "    importlib.import_module('tensorflow')\n"
                      "TABLE = {'x': ('bench.command', 'help text')}\n")
    assert {"keras.layers", "tensorflow", "bench.command"} <= imported_names(module)


def _package_of(path: Path, root: Path) -> str:
    """The dotted package that holds the module at ``path`` (its directory under ``root``'s
    parent): ``hpcrep.comm`` for hpcrep/comm/world.py and for hpcrep/comm/__init__.py."""
    return ".".join(path.relative_to(root.parent).parts[:-1])


def _module_of(path: Path, root: Path) -> str:
    """The dotted module name of ``path``: ``hpcrep.comm.world``; ``hpcrep.comm`` for an
    ``__init__.py``."""
    package = _package_of(path, root)
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (a directory with ``__init__.py``), by name."""
    return {_module_of(p, root): p for p in sorted(root.rglob("*.py"))}


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of a ``from M import ...`` in a module of ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, package: str, modules: dict[str, Path]
             ) -> Iterator[tuple[ast.AST, str, Optional[str]]]:
    """Yield ``(node, module, name)`` for every import in ``path`` that reaches a module in
    ``modules``: ``name`` is the imported name for ``from M import name`` when ``M.name`` is not
    itself a module (else the module is ``M.name`` and ``name`` None)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for end in range(len(parts), 0, -1):
                    if ".".join(parts[:end]) in modules:
                        yield node, ".".join(parts[:end]), None
                        break
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    yield node, f"{module}.{alias.name}", None
                elif module in modules:
                    yield node, module, alias.name


def import_graph(root: Path) -> dict[str, set[str]]:
    """The import graph of the package at ``root``: module -> the modules of the same package
    it imports (see the module docstring for what counts)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = _package_of(path, root)
        for _, target, _ in _imports(path, package, modules):
            if target != module and _package_of(modules[target], root) == package:
                graph[module].add(target)
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside ``members`` (breadth first, in
    sorted order, so the same graph always gives the same path)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start] if node != start else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    return []


def package_cycles(root: Path) -> list[list[str]]:
    """Import cycles among the modules of one package under ``root``: one path per strongly
    connected group of modules, from its first module (by name) back to it."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        """Tarjan's strongly connected components, from ``node``."""
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_cycle_through(graph, min(g), g) for g in groups)


def _is_private(name: str) -> bool:
    """One leading underscore, not a dunder (``__init__``, ``__file__``)."""
    return name.startswith("_") and not name.startswith("__")


def _holder(dotted: str, modules: dict[str, Path], root: Path) -> Optional[str]:
    """If the module path ``dotted`` names a private module, the package holding the first
    private one (``hpcrep.p`` for ``hpcrep.p._m.x``); else None."""
    parts = dotted.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if _is_private(part):
            return ".".join(parts[:i])
    return None


def _within(package: str, holder: str) -> bool:
    """Whether ``package`` is ``holder`` or one of its subpackages."""
    return package == holder or package.startswith(holder + ".")


def private_uses(root: Path) -> dict[tuple[str, str], str]:
    """(file under ``root``, ``private NAME``) -> the importer's package, for every use of a
    private name from outside the package that holds it (see the module docstring)."""
    modules = _modules(root)
    found: dict[tuple[str, str], str] = {}
    for path in modules.values():
        package = _package_of(path, root)
        file = path.relative_to(root).as_posix()
        aliases: dict[str, str] = {}  # local name -> hpcrep module it is bound to
        tree = ast.parse(path.read_text(), str(path))
        for node, target, name in _imports(path, package, modules):
            holder = _holder(target, modules, root)
            if holder is not None and not _within(package, holder):
                found[(file, f"private {target}")] = package
            target_package = _package_of(modules[target], root)
            if name is not None and _is_private(name) and target_package != package:
                found[(file, f"private {target}.{name}")] = package
            if isinstance(node, ast.ImportFrom) and name is None:
                for alias in node.names:
                    if f"{_from_module(node, package)}.{alias.name}" == target:
                        aliases[alias.asname or alias.name] = target
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name == target:
                        aliases[alias.asname] = target
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            base = ast.unparse(node.value)
            target = aliases.get(base, base if base in modules else None)
            if target is not None and _package_of(modules[target], root) != package:
                found[(file, f"private {target}.{node.attr}")] = package
    return found


def problems() -> dict[tuple[str, str], str]:
    """Every cycle and private use in hpcrep, keyed as KNOWN is."""
    found = {(f"{cycle[0].rsplit('.', 1)[0]}", "cycle " + " -> ".join(cycle)): "import cycle"
             for cycle in package_cycles(HPCREP)}
    found.update({key: "private name of another package" for key in private_uses(HPCREP)})
    return found


def test_no_import_cycles_or_private_names_across_packages():
    """hpcrep has no import cycle inside a package and no private name used across packages,
    except the KNOWN ones."""
    found = problems()
    new = set(found) - set(KNOWN)
    assert not new, "\n".join(f"{where}: {what} ({found[where, what]})"
                              for where, what in sorted(new))


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write a package ``fake`` of ``files`` (path under it -> source) with every
    ``__init__.py`` it needs; return its directory."""
    root = tmp_path / "fake"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (directory / "__init__.py").touch()
    return root


def test_the_cycle_check_finds_a_planted_cycle_and_reports_its_path(tmp_path):
    """A three-module cycle (one edge a lazy import) is found and reported as its path; a
    module that only leads into it, or an edge from another package, is not part of it."""
    root = _fake_package(tmp_path, {
        "a.py": "from fake import b\n",
        "b.py": "def f():\n    from fake.c import g  # lazy, still an edge\n",
        "c.py": "from . import a\ndef g():\n    pass\n",
        "d.py": "import fake.a\n",  # into the cycle, not part of it
        "sub/x.py": "from fake import d\n",  # another package: not an edge here
    })
    assert package_cycles(root) == [["fake.a", "fake.b", "fake.c", "fake.a"]]
    (root / "c.py").write_text("def g():\n    pass\n")
    assert package_cycles(root) == []


def test_the_cycle_check_resolves_submodules_and_reexports(tmp_path):
    """``from pkg import submodule`` points at the submodule (no cycle with ``__init__``), but
    importing a name that ``__init__`` re-exports from inside the package is a cycle."""
    root = _fake_package(tmp_path, {
        "__init__.py": "from fake.api import run\n",
        "api.py": "from fake import impl  # the submodule, not __init__\nrun = impl.run\n",
        "impl.py": "def run():\n    pass\n",
    })
    assert package_cycles(root) == []
    (root / "impl.py").write_text("from fake import run  # through __init__: a cycle\n")
    assert package_cycles(root) == [["fake", "fake.api", "fake.impl", "fake"]]


def test_the_private_check_finds_planted_private_uses(tmp_path):
    """Every form of private use from another package is found; the holder's own modules and
    dunder names are not."""
    root = _fake_package(tmp_path, {
        "core/engine.py": "_hidden = 1\n\ndef _helper():\n    pass\n",
        "core/_impl.py": "X = 1\n",
        "core/user.py": "from fake.core.engine import _hidden\nfrom fake.core import _impl\n",
        "app/a.py": "from fake.core.engine import _hidden\n",
        "app/b.py": "from fake.core import engine as e\n\ndef f():\n    e._helper()\n",
        "app/c.py": "import fake.core.engine\nfake.core.engine._helper()\n",
        "app/d.py": "def f():\n    import fake.core._impl\n",
        "app/e.py": "from ..core.engine import _helper, __name__\n",
        "app/fine.py": "from fake.core import engine\nengine.__name__\n",
        "core/sub/ok.py": "from fake.core._impl import X\n",  # a private module serves its holder
    })
    assert set(private_uses(root)) == {
        ("app/a.py", "private fake.core.engine._hidden"),
        ("app/b.py", "private fake.core.engine._helper"),
        ("app/c.py", "private fake.core.engine._helper"),
        ("app/d.py", "private fake.core._impl"),
        ("app/e.py", "private fake.core.engine._helper"),
    }
