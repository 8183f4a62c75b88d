"""The layering of ../shared/DESIGN.md, checked on the source: a lower layer never imports a
higher one, at module level, inside functions, or by name through importlib.

- hpcrep/comm (MPI + numpy) never imports TensorFlow or Keras;
- hpcrep/tensorflow never imports hpcrep.replicator (the layer above it);
- hpcrep/checkpoint never imports hpcrep.launch: Slurm questions (job id, requeue) go to
  hpcrep.slurm, the one package that knows Slurm; and hpcrep/slurm imports neither hpcrep.launch
  nor hpcrep.checkpoint, which ask it;
- nothing under hpcrep/ imports the top-level benchmark (bench) or workloads (jobs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
# new violation appears and when one of these is gone (then delete it here).
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
    found = violations()
    new = set(found) - set(KNOWN)
    assert not new, "layering broken: " + "; ".join(
        f"hpcrep/{file} imports {root} ({found[file, root]})" for file, root in sorted(new))


def test_known_violations_are_still_there():
    gone = set(KNOWN) - set(violations())
    assert not gone, f"fixed, so remove from KNOWN: {sorted(gone)}"


def test_the_scanner_sees_imports_inside_functions_and_through_importlib(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import importlib\n"
                      "def f():\n    import keras.layers\n"
                      "    importlib.import_module('tensorflow')\n"
                      "TABLE = {'x': ('bench.command', 'help text')}\n")
    assert {"keras.layers", "tensorflow", "bench.command"} <= imported_names(module)
