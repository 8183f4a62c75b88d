"""Which explicit-API training features compose: the expectations of ``test_composition.py``.

Pure Python (no TensorFlow): ``python tests/mpi/composition_table.py > docs/composition.md``
writes the page from this table, and ``tests/unit/test_composition_doc.py`` checks that the
page and the table agree.

Every cell is one of: ``RUNS`` (trains; ranks bitwise equal), a refusal (the exact message of
the :mod:`hpcrep.errors` exception raised on every rank before training), or ``NA`` (the pair
is not something a user can write: one argument, or an option of an object the case lacks).
"""

from __future__ import annotations

import itertools
from typing import Optional, Union

#: Feature name -> what a user writes (explicit API, ``import hpcrep.tensorflow as hvd``).
FEATURES: dict[str, str] = {
    "zero": "`DistributedOptimizer(opt, shard_optimizer_state=True)`",
    "powersgd": "`compression=hvd.Compression.powersgd(2)`",
    "fp16": "`compression=hvd.Compression.fp16`",
    "mixed": "`mixed_float16` policy, `DistributedOptimizer(LossScaleOptimizer(opt))`",
    "accum": "`backward_passes_per_step=2`",
    "adasum": "`op=hvd.Adasum`",
    "tape": "`hvd.DistributedGradientTape(tape)` (gradient options on the tape)",
    "timeline": "`hvd.start_timeline(path)`",
    "autotune": "`HPCREP_AUTOTUNE=1`",
}

#: Words a refusal's message must contain to name each feature (case-insensitive).
NAMES: dict[str, tuple[str, ...]] = {
    "zero": ("shard_optimizer_state",),
    "powersgd": ("powersgd",),
    "fp16": ("fp16",),
    "mixed": ("LossScaleOptimizer",),
    "accum": ("backward_passes_per_step",),
    "adasum": ("Adasum",),
    "tape": ("DistributedGradientTape",),
    "timeline": ("timeline",),
    "autotune": ("HPCREP_AUTOTUNE",),
}

DRIVERS: tuple[str, ...] = ("fit", "loop")

RUNS = "runs"
NA = "n/a"

#: The features that do not change the arithmetic of an exact exchange: a case with them and
#: without compression or Adasum must equal (to float tolerance) the case without them.
NEUTRAL = frozenset({"zero", "tape", "timeline", "autotune"})
INEXACT = frozenset({"powersgd", "fp16", "adasum"})

_NOT_APPLICABLE: dict[frozenset, str] = {
    frozenset({"powersgd", "fp16"}): "both are values of the one `compression` argument",
    frozenset({"tape", "zero"}): (
        "`shard_optimizer_state` is a `DistributedOptimizer` option; with a tape, the "
        "optimizer would reduce the reduced gradients again. For ZeRO in a custom loop, use a "
        "plain `tf.GradientTape` and the sharded optimizer's `apply`"),
    frozenset({"tape", "accum"}): (
        "`backward_passes_per_step` is a `DistributedOptimizer` option; a tape reduces on "
        "every `gradient` call. Accumulate with a plain `tf.GradientTape` and the "
        "optimizer's `apply`"),
}

#: Refused pairs -> (the exception's class name in hpcrep.errors, its exact message).
REFUSED: dict[frozenset, tuple[str, str]] = {
    frozenset({"zero", "powersgd"}): (
        "ShardedStateError",
        "shard_optimizer_state=True cannot be combined with a stateful compression such as "
        "Compression.powersgd yet (its error buffers are per full gradient; ZeRO's step "
        "reduce-scatters flat slices): use Compression.none or fp16, or do not shard"),
    frozenset({"zero", "mixed"}): (
        "ShardedStateError",
        "shard_optimizer_state=True wraps the optimizer that owns the slots, not a "
        "LossScaleOptimizer; use keras.optimizers.LossScaleOptimizer("
        "hvd.DistributedOptimizer(opt, shard_optimizer_state=True)) (what compile builds "
        "under a mixed_float16 policy)"),
    frozenset({"zero", "accum"}): (
        "ShardedStateError",
        "SGD cannot shard its state exactly with backward_passes_per_step=2 (needs 1). Change "
        "these options or use shard_optimizer_state=False."),
    frozenset({"zero", "adasum"}): (
        "ShardedStateError",
        "SGD cannot shard its state exactly with op=Adasum (gradients are reduce-scattered: "
        "Average or Sum). Change these options or use shard_optimizer_state=False."),
    frozenset({"powersgd", "adasum"}): (
        "CollectiveArgumentError",
        "Compression.powersgd(rank=2, warmup_steps=0, seed=0) averages gradients: it needs "
        "op=Average and no gradient_predivide_factor (got op=Adasum, factor 1.0); drop them or "
        "use Compression.none/fp16"),
}


def cell(features: frozenset, driver: str) -> Union[str, tuple[str, str]]:
    """Return ``RUNS``, ``NA`` or ``(error class name, message)`` for one case."""
    if "tape" in features and driver == "fit":
        return NA  # model.fit applies through the optimizer; a tape is a custom loop's
    if features in _NOT_APPLICABLE:
        return NA
    return REFUSED.get(features, RUNS)


def cases() -> list[tuple[frozenset, str]]:
    """Every feature alone and every pair, with each driver, in a fixed order."""
    names = list(FEATURES)
    combos = [frozenset({f}) for f in names]
    combos += [frozenset(p) for p in itertools.combinations(names, 2)]
    return [(c, d) for c in combos for d in DRIVERS]


def case_id(features: frozenset, driver: str) -> str:
    """A stable id: the features in table order joined by ``+``, then the driver."""
    return "+".join(f for f in FEATURES if f in features) + "-" + driver


def reference(features: frozenset) -> Optional[frozenset]:
    """The case this one must equal to float tolerance (same driver), or None."""
    if features & INEXACT or not features & NEUTRAL:
        return None
    return features - NEUTRAL


def _mark(features: frozenset) -> str:
    both = {d: cell(features, d) for d in DRIVERS}
    shown = {d: c for d, c in both.items() if c != NA}
    if not shown:
        return "—"
    words = {d: "runs" if c == RUNS else "refused" for d, c in shown.items()}
    if len(shown) == len(DRIVERS) and len(set(words.values())) == 1:
        return next(iter(words.values()))
    return ", ".join(f"{w} ({d})" for d, w in words.items())


def markdown() -> str:
    """Return docs/composition.md: the matrix, then each refusal's message."""
    names = list(FEATURES)
    lines = [
        "# Which training features compose",
        "",
        "Generated by `python tests/mpi/composition_table.py` from the expectations of",
        "`tests/mpi/test_composition.py`, which runs every cell at 4 ranks and at 1 rank",
        "(`tests/unit/test_composition_doc.py` keeps this page in step with them).",
        "",
        "Each cell is a pair of features (the diagonal: the feature alone), driven by `model.fit`",
        "(fit) and by a custom `@tf.function` loop calling `opt.apply(grads, vars)` (loop).",
        "\"runs\": it trains, every rank ends with bitwise equal weights, and where the exchange",
        "is exact (no compression, no Adasum) the ZeRO, tape, timeline and autotune variants",
        "equal the run without them to float tolerance. \"refused\": an `hpcrep.errors`",
        "exception is raised on every rank before training, with the message listed below.",
        "\"—\": not a combination one can write (see below). A DistributedGradientTape runs in",
        "the custom loop only: `model.fit` applies gradients through the optimizer. Adasum",
        "cases run on 1, 2, 4, ... ranks only. What the ZeRO + mixed precision refusal advises,",
        "`LossScaleOptimizer(DistributedOptimizer(opt, shard_optimizer_state=True))`, is tested",
        "too: it trains with both drivers and equals the unsharded mixed-precision run.",
        "",
        "Features:",
        "",
    ]
    lines += [f"- **{n}**: {FEATURES[n]}" for n in names]
    lines += ["", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i, a in enumerate(names):
        row = []
        for j, b in enumerate(names):
            row.append("" if j < i else _mark(frozenset({a, b})))
        lines.append(f"| **{a}** | " + " | ".join(row) + " |")
    lines += ["", "## Not combinations", ""]
    for features, why in _NOT_APPLICABLE.items():
        pair = " + ".join(f for f in FEATURES if f in features)
        lines.append(f"- **{pair}**: {why}.")
    lines += ["", "## Refusals", ""]
    for features, (kind, message) in sorted(REFUSED.items(), key=lambda kv: case_id(kv[0], "")):
        pair = " + ".join(f for f in FEATURES if f in features)
        lines.append(f"- **{pair}** (`{kind}`): {message}")
    if not REFUSED:
        lines.append("None.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
