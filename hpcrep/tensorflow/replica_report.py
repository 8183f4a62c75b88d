"""What the replica canary says: its findings from every rank's checksums, as report lines.

Pure Python and numpy (no TensorFlow, no MPI): :mod:`hpcrep.tensorflow.replica_check` gathers
the numbers and calls :func:`findings`, then prints :attr:`Findings.lines`. Every rank that is
given the same gathered numbers gets the same findings, so every rank decides alike (whether to
abort, whether to rebroadcast).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from hpcrep.config import ranks_text

TRAINABLE = "trainable"
OPTIMIZER = "optimizer state"
NON_TRAINABLE = "non-trainable"
LOCAL = "local"
# A difference in these is an error (the replicas drifted apart) ...
CHECKED = (TRAINABLE, OPTIMIZER)
# ... in these it is expected (local batch-norm statistics, registered local variables).
MEANT_TO_DIFFER = (NON_TRAINABLE, LOCAL)
PREFIX = "hpcrep replica check"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One checked variable: its label in reports and its kind (one of the kinds above)."""

    name: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Findings:
    """What one check found.

    Attributes:
        differing: names of trainable and optimizer-state variables that differ across ranks.
        meant_to_differ: names of non-trainable or local variables that differ (information).
        nonfinite: names of variables holding NaN or inf on some rank.
        lines: the report, one line each, every line starting with ``hpcrep replica check``.
    """

    differing: tuple[str, ...] = ()
    meant_to_differ: tuple[str, ...] = ()
    nonfinite: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()

    @property
    def diverged(self) -> bool:
        """True if some trainable or optimizer-state variable differs across ranks."""
        return bool(self.differing)


def _magnitude(value: float) -> str:
    return "NaN" if np.isnan(value) else f"{value:.1e}"


def holders(sums: Sequence[int], magnitudes: Optional[Sequence[float]],
            ranks: Sequence[int]) -> str:
    """Return who holds what for one variable: ``ranks 0-2 agree, rank 3 differs, max |x -
    x[rank 0]| = 1.0e-03``.

    Args:
        sums: each rank's checksum of the variable, in the communicator's rank order.
        magnitudes: each rank's max |x - x[rank 0]| (NaN where NaN is involved), or None.
        ranks: the job rank of each communicator rank (for the text).
    """
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(sums):
        groups.setdefault(int(s), []).append(i)
    first = groups.pop(int(sums[0]))
    parts = [f"{ranks_text([ranks[i] for i in first])} agree" if len(first) > 1
             else f"{ranks_text([ranks[first[0]]])} alone"]
    for members in groups.values():
        text = ranks_text([ranks[i] for i in members])
        text += " differs" if len(members) == 1 else " differ (holding one value)"
        if magnitudes is not None:
            worst = max((magnitudes[i] for i in members),
                        key=lambda m: np.inf if np.isnan(m) else m)
            text += f", max |x - x[{ranks_text([ranks[0]])}]| = {_magnitude(worst)}"
        parts.append(text)
    return ", ".join(parts)


def findings(step: int, entries: Sequence[Entry], differs: Sequence[bool],
             sums: dict[int, Sequence[int]], magnitudes: dict[int, Sequence[float]],
             nonfinite: dict[int, Sequence[bool]], ranks: Sequence[int], action: str,
             show_meant_to_differ: bool = True) -> Findings:
    """Return the findings of one check from the numbers gathered from every rank.

    Args:
        step: the step reported (the optimizer's iterations after the update, or a count).
        entries: the checked variables, in checking order.
        differs: per entry, whether the ranks' checksums differ (from the MAX allreduce).
        sums: entry index -> every rank's checksum, for the entries to describe.
        magnitudes: entry index -> every rank's max |x - x[rank 0]|, where measured.
        nonfinite: entry index -> per rank, whether it holds NaN or inf.
        ranks: the job rank of each rank of the checking communicator.
        action: ``warn``, ``abort`` or ``rebroadcast`` (named in the report).
        show_meant_to_differ: describe the non-trainable and local variables that differ (the
            canary does so once, not again while the same set differs).
    """
    head = f"{PREFIX}, step {step}: "
    lines: list[str] = []
    checked = [i for i, e in enumerate(entries) if e.kind in CHECKED]
    differing = [i for i in checked if differs[i]]
    if differing:
        n_train = sum(1 for i in checked if entries[i].kind == TRAINABLE)
        d_train = sum(1 for i in differing if entries[i].kind == TRAINABLE)
        d_opt = len(differing) - d_train
        summary = f"{d_train} of {n_train} trainable variables"
        if d_opt:
            summary += f" and {d_opt} of {len(checked) - n_train} optimizer state variables"
        details = [f"{_label(entries[i])}: {holders(sums[i], magnitudes.get(i), ranks)}"
                   for i in differing]
        summary = head + summary + f" differ across ranks (action: {action})"
        lines.append(f"{summary}: {details[0]}" if len(details) == 1 else summary)
        if len(details) > 1:
            lines += [head + d for d in details]
    meant = [i for i, e in enumerate(entries) if e.kind in MEANT_TO_DIFFER and differs[i]]
    if meant and show_meant_to_differ:
        lines.append(head + f"{len(meant)} non-trainable or local variables differ across ranks, "
                     "as they may by design (local batch-norm statistics, registered local "
                     "variables); information, not an error, reported again only when the set "
                     "changes")
        lines += [head + f"{_label(entries[i])}: {holders(sums[i], magnitudes.get(i), ranks)}"
                  for i in meant]
    bad = sorted(i for i, flags in nonfinite.items() if any(flags))
    for i in bad:
        where = [ranks[r] for r, flag in enumerate(nonfinite[i]) if flag]
        every = len(where) == len(ranks)
        lines.append(head + f"{_label(entries[i])} holds NaN or inf on "
                     f"{'every rank' if every else ranks_text(where)}")
    return Findings(differing=tuple(entries[i].name for i in differing),
                    meant_to_differ=tuple(entries[i].name for i in meant),
                    nonfinite=tuple(entries[i].name for i in bad), lines=tuple(lines))


def _label(entry: Entry) -> str:
    return entry.name if entry.kind in (TRAINABLE, NON_TRAINABLE) else \
        f"{entry.name} ({entry.kind})"
