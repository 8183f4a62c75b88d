"""Slurm batch scripts: validated options, a pure Jinja2 renderer, and submission.

Templates ship with the package in ``hpcrep/slurm/templates``; the one-node test cluster and
example jobs live in the top-level ``slurm/`` folder of the repository.
"""

from hpcrep.slurm.options import JobOptions, validate
from hpcrep.slurm.render import render

__all__ = ["JobOptions", "validate", "render"]
