"""Render a Slurm batch script from :class:`JobOptions`: a pure function over a Jinja2 template.

The template ships inside the package (``hpcrep/slurm/templates/job.sh.j2``). Values that reach
the shell are quoted with :func:`shlex.quote`; ``#SBATCH`` values with spaces or ``#`` are
double-quoted (sbatch reads those lines itself and strips the quotes; options reject what quoting
cannot make safe: newlines, double quotes, backslashes).
"""

from __future__ import annotations

import functools
import shlex

import jinja2

from hpcrep.slurm.options import JobOptions, quote_sbatch


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("hpcrep.slurm", "templates"),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["q"] = shlex.quote
    env.filters["sbatch_value"] = quote_sbatch
    return env


class _View:
    """Template access to options by attribute or by ``o[name]``."""

    def __init__(self, options: JobOptions) -> None:
        self._o = options

    def __getattr__(self, name: str):
        return getattr(self._o, name)

    def __getitem__(self, name: str):
        return getattr(self._o, name)


def render(options: JobOptions, template: str = "job.sh.j2") -> str:
    """Return the sbatch script for ``options`` (pure: same options, same text)."""
    return _environment().get_template(template).render(o=_View(options),
                                                        command=shlex.join(options.command))
