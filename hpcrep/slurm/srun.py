"""Starting ranks with ``srun`` inside an allocation: the command line and the PMI plugin.

``srun`` starts MPI ranks through a PMI plugin, and the plugin must match the MPI library: a
wrong one does not fail, it starts N singletons of size 1. Debian's Open MPI works under
``--mpi=pmix``, MPICH (Debian's or the wheel) under ``--mpi=pmi2``.
"""

from __future__ import annotations

from typing import Optional, Sequence

# MPI library family (as hpcrep.launch.mpirun.flavor names it) -> srun --mpi plugin
PMI_PLUGINS: dict[str, str] = {"openmpi": "pmix", "mpich": "pmi2"}


def mpi_plugin(mpi_family: str) -> str:
    """Return the ``srun --mpi`` plugin for ``mpi_family`` (``openmpi`` or ``mpich``); ``pmix``
    for a family not in :data:`PMI_PLUGINS`."""
    return PMI_PLUGINS.get(mpi_family, "pmix")


def srun_command(n: Optional[int], command: Sequence[str], mpi_plugin: str) -> list[str]:
    """Return the ``srun`` argv that runs ``command`` as ``n`` tasks (all tasks if None)."""
    argv = ["srun", f"--mpi={mpi_plugin}"]
    if n is not None:
        argv += ["--ntasks", str(n)]
    return argv + list(command)
