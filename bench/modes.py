"""The names of the benchmark's extra hpcrep variants, which ``hpcrep bench --variants`` adds
to the default modes (hpcrep, nosync, mpi4py):

- ``hpcrep_powersgdR`` (R an int >= 1, e.g. ``hpcrep_powersgd2``): hpcrep's tape or optimizer
  wrapper with ``compression=hvd.Compression.powersgd(rank=R, seed=POWERSGD_SEED)``;
- ``hpcrep_autotune``: hpcrep's wrappers traced with ``HPCREP_AUTOTUNE=1``; the job settles the
  tuner before its timed rounds and freezes it (:func:`bench.overlap.settle_autotune`).

Everything here is local and pure (no TensorFlow, no MPI), so the command's argument parsing,
the reports and the plots can use it without importing TensorFlow.
"""

from __future__ import annotations

import re
from typing import Optional

AUTOTUNE = "hpcrep_autotune"
POWERSGD_PREFIX = "hpcrep_powersgd"
# The seed of the starting Q of every PowerSGD the benchmark makes: the compressing variants'
# self-check builds its probe from the same starting Q (bench.selfcheck).
POWERSGD_SEED = 0
EXAMPLES = (f"{POWERSGD_PREFIX}2", AUTOTUNE)

_POWERSGD = re.compile(rf"{POWERSGD_PREFIX}([1-9][0-9]*)")


def powersgd_rank(mode: str) -> Optional[int]:
    """The PowerSGD rank R of ``mode`` if it is ``hpcrep_powersgdR`` (R >= 1, no leading zero),
    else None."""
    match = _POWERSGD.fullmatch(mode)
    return int(match.group(1)) if match else None


def is_extra(mode: str) -> bool:
    """True if ``mode`` is one of the extra variants (:func:`powersgd_rank` or ``AUTOTUNE``)."""
    return mode == AUTOTUNE or powersgd_rank(mode) is not None


def parse_variants(text: str) -> list[str]:
    """Split ``hpcrep bench --variants``'s comma-separated ``text`` into extra variants, in
    order and without repeats ('' gives none).

    Raises:
        ValueError: a name that is not an extra variant, saying which are.
    """
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if not is_extra(n)]
    if bad:
        raise ValueError(f"--variants: unknown {', '.join(repr(b) for b in bad)}; expected "
                         f"{POWERSGD_PREFIX}R (R an int >= 1, e.g. {POWERSGD_PREFIX}2) or "
                         f"{AUTOTUNE}, comma-separated")
    return names


def display_name(mode: str, names: dict[str, str]) -> str:
    """The report's name of ``mode``: ``names[mode]``, 'hpcrep PowerSGD rank R' or 'hpcrep
    autotuned' for the extra variants, else ``mode`` itself."""
    if mode in names:
        return names[mode]
    rank = powersgd_rank(mode)
    if rank is not None:
        return f"hpcrep PowerSGD rank {rank}"
    return "hpcrep autotuned" if mode == AUTOTUNE else mode
