"""Everything hpcrep knows about Slurm, in one package.

- :mod:`.environment`: the one table of ``SLURM_*`` variables (job id, tasks, restart count...);
- :mod:`.srun`: the ``srun`` command line that starts ranks, with the PMI plugin for the MPI;
- :mod:`.requeue`: ``scontrol requeue`` of the running job (after a pre-timeout checkpoint);
- :mod:`.options`, :mod:`.render`, :mod:`.command`: batch scripts, validated options, a pure
  Jinja2 renderer, and submission (``hpcrep slurm render|submit``).

Other packages ask this one (``hpcrep.launch`` for ``hpcrep run`` inside an allocation,
``hpcrep.checkpoint`` for requeue); it imports neither of them.
Templates ship with the package in ``hpcrep/slurm/templates``; the one-node test cluster and
example jobs live in the top-level ``slurm/`` folder of the repository.
"""

from hpcrep.slurm.options import JobOptions, validate
from hpcrep.slurm.render import render

__all__ = ["JobOptions", "validate", "render"]
