"""The PNG of ``hpcrep analyze --png``: per step, compute and exposed communication (averaged
over ranks), and each rank's straggler score; a second trace's bars beside the first's."""

from __future__ import annotations

from typing import Optional

from hpcrep.analysis.trace import Analysis


def draw(result: Analysis, path: str, against: Optional[Analysis] = None) -> None:
    """Write the figure of ``result`` (and ``against``) to ``path``."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (steps_ax, ranks_ax) = plt.subplots(1, 2, figsize=(11, 4),
                                             gridspec_kw={"width_ratios": [3, 1]})
    runs = [("this", result)] + ([("against", against)] if against is not None else [])
    width = 0.8 / len(runs)
    for i, (label, run) in enumerate(runs):
        numbers = run.step_numbers()
        rows = [run.mean_over_ranks(n) for n in numbers]
        x = [n + (i - (len(runs) - 1) / 2) * width for n in numbers]
        compute = [r["compute"] for r in rows]
        exposed = [r["exposed"] for r in rows]
        steps_ax.bar(x, compute, width, label=f"{label}: compute")
        steps_ax.bar(x, exposed, width, bottom=compute, label=f"{label}: exposed communication")
        ranks = sorted(run.straggler_ms)
        ranks_ax.bar([r + (i - (len(runs) - 1) / 2) * width for r in ranks],
                     [run.straggler_ms[r] for r in ranks], width, label=label)
    steps_ax.set_xlabel("step")
    steps_ax.set_ylabel("ms (mean over ranks)")
    steps_ax.set_title("step time")
    steps_ax.legend(fontsize=8)
    ranks_ax.set_xlabel("rank")
    ranks_ax.set_ylabel("ms later than the median rank")
    ranks_ax.set_title("straggler score")
    ranks_ax.axhline(0, color="black", linewidth=0.5)
    if against is not None:
        ranks_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
