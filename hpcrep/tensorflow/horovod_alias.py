"""Run an unchanged Horovod script on hpcrep: ``import horovod.tensorflow`` gives hpcrep's module.

Where Horovod is not installed, :func:`horovod_alias` puts an import finder first on
``sys.meta_path`` that answers for Horovod's TensorFlow names with hpcrep's modules (the modules
themselves, not copies: ``horovod.tensorflow is hpcrep.tensorflow``):

====================================  ==================================
``horovod.tensorflow[.X]``            ``hpcrep.tensorflow[.X]``
``horovod.keras[.X]``                 ``hpcrep.tensorflow.keras[.X]``
``horovod``                           an empty package holding those two
====================================  ==================================

Other Horovod modules (``horovod.torch``, ...) raise ``ModuleNotFoundError`` naming what is
mapped. The first mapped import prints one line on rank 0's stderr. ``hpcrep run`` (through
``python -m hpcrep --no-transparent``) installs it for scripts that are not run transparently;
where Horovod is installed nothing is mapped and the script gets the real Horovod.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Iterator, Optional, Sequence

# Horovod's module prefix -> hpcrep's module that answers for it.
ALIASES: dict[str, str] = {
    "horovod.tensorflow": "hpcrep.tensorflow",
    "horovod.keras": "hpcrep.tensorflow.keras",
}
ROOT = "horovod"


def target(name: str) -> Optional[str]:
    """Return the hpcrep module that answers for Horovod module ``name``, or None (not mapped)."""
    for prefix, module in ALIASES.items():
        if name == prefix or name.startswith(prefix + "."):
            return module + name[len(prefix):]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias by putting hpcrep's module in ``sys.modules`` under Horovod's name (the
    import system returns what ``sys.modules`` holds after ``exec_module``)."""

    def __init__(self, finder: "HorovodAliasFinder") -> None:
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        return None  # the default module; replaced in exec_module for aliases

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name == ROOT:
            module.__doc__ = ("hpcrep's stand-in for Horovod (hpcrep.tensorflow.horovod_alias): "
                              "horovod.tensorflow and horovod.keras are hpcrep's modules.")
            return
        real = importlib.import_module(target(name) or name)
        sys.modules[name] = real
        self._finder.announce()


class HorovodAliasFinder(importlib.abc.MetaPathFinder):
    """Finds Horovod's TensorFlow modules as hpcrep's (see the module docstring)."""

    def __init__(self) -> None:
        self._loader = _AliasLoader(self)
        self.announced = False

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target_module: Optional[types.ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != ROOT and not fullname.startswith(ROOT + "."):
            return None
        if fullname != ROOT and target(fullname) is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: Horovod is not installed, and hpcrep answers only "
                f"for {', '.join(ALIASES)} (as {', '.join(ALIASES.values())})", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self._loader,
                                              is_package=fullname == ROOT)

    def announce(self) -> None:
        """Print, once and on rank 0 only, that Horovod's names are hpcrep's modules."""
        if self.announced:
            return
        self.announced = True
        from mpi4py import MPI  # noqa: PLC0415 - hpcrep.tensorflow has initialised MPI by now

        if MPI.COMM_WORLD.Get_rank() == 0:
            print("hpcrep: Horovod is not installed here; horovod.tensorflow and horovod.keras "
                  "are hpcrep.tensorflow and hpcrep.tensorflow.keras (hpcrep's horovod alias)",
                  file=sys.stderr, flush=True)


def horovod_installed() -> bool:
    """Return True if a real Horovod can be imported here (the alias is not consulted)."""
    return any(not isinstance(f, HorovodAliasFinder) and f.find_spec(ROOT, None) is not None
               for f in sys.meta_path if hasattr(f, "find_spec"))


@contextlib.contextmanager
def horovod_alias() -> Iterator[bool]:
    """Map ``horovod.*`` to hpcrep's modules while the block runs, where Horovod is not
    installed; yield whether it did. On exit the finder and the aliases it made are removed.
    Local (the import prints one line on rank 0)."""
    if horovod_installed():
        yield False
        return
    finder = HorovodAliasFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield True
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == ROOT or n.startswith(ROOT + ".")]:
            del sys.modules[name]
