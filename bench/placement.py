"""How many cores each benchmark rank gets, and the environment that holds it to them.

Weak scaling compares n ranks with 1 rank at the *same* cores per rank; if the 1-rank baseline
got every core and n ranks got ``cores // n`` each, every efficiency would mix rank scaling with
thread scaling. ``hpcrep bench`` therefore fixes the cores per rank for the whole run
(``--cores-per-rank``) and gives every job that many TensorFlow threads.
"""

from __future__ import annotations

from typing import Sequence


def default_cores_per_rank(cores: int, ranks: Sequence[int]) -> int:
    """Return the cores per rank that let the largest rank count fit: ``cores // max(ranks)``,
    at least 1 (so 1 on machines with few cores; rank counts beyond the cores oversubscribe)."""
    if not ranks or min(ranks) < 1:
        raise ValueError(f"need positive rank counts, got {list(ranks)}")
    return max(1, int(cores) // max(ranks))


def oversubscribed(cores: int, cores_per_rank: int, ranks: int) -> bool:
    """True if ``ranks`` ranks of ``cores_per_rank`` threads need more than ``cores`` cores."""
    return ranks * cores_per_rank > cores


def thread_env(cores_per_rank: int) -> dict[str, str]:
    """Environment variables that give every rank of a job ``cores_per_rank`` compute threads:
    ``HPCREP_THREADS`` (TensorFlow's intra-op pool, read by ``hvd.init()``), ``OMP_NUM_THREADS``
    (any OpenMP/BLAS pool) and ``HPCREP_INTER_OP_THREADS`` (at most ``cores_per_rank``: left to
    hpcrep's automatic choice, a 1-rank run on an idle machine would take a second core that the
    runs it is compared with do not have)."""
    if cores_per_rank < 1:
        raise ValueError(f"--cores-per-rank must be at least 1, got {cores_per_rank}")
    return {"HPCREP_THREADS": str(cores_per_rank), "OMP_NUM_THREADS": str(cores_per_rank),
            "HPCREP_INTER_OP_THREADS": str(min(2, cores_per_rank))}
