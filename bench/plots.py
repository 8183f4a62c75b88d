"""The benchmark's PNG plots, drawn the same way every time so they read at a glance.

- Rank counts sit on a log2 axis whose ticks are the integers measured or projected
  (:func:`rank_ticks`), never 1.2, 1.4, ...
- Every peer has one colour in every plot (:data:`PEER_COLOURS`); ideal scaling is a black
  dashed line.
- The ``*_figure`` functions build a figure and return it (tests inspect them); the ``plot_*``
  functions write it to a PNG and return the path.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from bench.modes import AUTOTUNE, display_name, powersgd_rank

PEER_NAMES = {"hpcrep": "hpcrep", "nosync": "no-sync upper bound",
              "mpi4py": "raw mpi4py allreduce", "horovod": "Horovod",
              "mwms": "tf.distribute MultiWorkerMirroredStrategy",
              AUTOTUNE: "hpcrep autotuned"}  # hpcrep_powersgdR: peer_name()
# Colour-blind-safe (Okabe-Ito), one per peer, used by every plot.
PEER_COLOURS = {"hpcrep": "#0072B2", "nosync": "#999999", "mpi4py": "#E69F00",
                "horovod": "#009E73", "mwms": "#CC79A7", AUTOTUNE: "#56B4E9"}
# hpcrep_powersgdR, by R: 1, 2, 4 (then again from 8) have colours of their own.
POWERSGD_COLOURS = ("#D55E00", "#882255", "#F0E442")
MODEL_COLOURS = {"resnet50": "#0072B2", "sngan": "#D55E00", "d4pg": "#009E73"}
OTHER_COLOURS = ["#56B4E9", "#F0E442", "#000000", "#882255"]
IDEAL = {"color": "black", "linestyle": "--", "linewidth": 1, "zorder": 3}


def colour(name: str, table: dict[str, str] = PEER_COLOURS) -> str:
    """The colour of ``name`` in ``table`` (``hpcrep_powersgdR`` among the peers: one of
    :data:`POWERSGD_COLOURS` by R); an unknown name gets a fixed colour chosen from its letters
    (the same in every plot and every run)."""
    if name in table:
        return table[name]
    rank = powersgd_rank(name) if table is PEER_COLOURS else None
    if rank is not None:
        return POWERSGD_COLOURS[(rank.bit_length() - 1) % len(POWERSGD_COLOURS)]
    return OTHER_COLOURS[sum(name.encode()) % len(OTHER_COLOURS)]


def peer_name(mode: str) -> str:
    """The name plots and reports give ``mode`` (:data:`PEER_NAMES`, 'hpcrep PowerSGD rank R'
    for ``hpcrep_powersgdR``, else the mode itself)."""
    return display_name(mode, PEER_NAMES)


def rank_ticks(ranks: Iterable[int]) -> list[int]:
    """Integer ticks for a log2 rank axis: every rank count given, plus the powers of two
    between the smallest and the largest."""
    values = sorted({int(r) for r in ranks if int(r) >= 1})
    if not values:
        return []
    powers, p = [], 1
    while p <= values[-1]:
        if p >= values[0]:
            powers.append(p)
        p *= 2
    return sorted(set(values) | set(powers))


def set_rank_axis(ax: Any, ranks: Iterable[int]) -> None:
    """Make ``ax``'s x axis a log2 rank axis with integer ticks only."""
    from matplotlib.ticker import NullLocator  # noqa: PLC0415

    ticks = rank_ticks(ranks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    if len(ticks) == 1:  # one point: give the axis some width around it
        ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)
    ax.set_xlabel("ranks")


def model_figure(name: str, model: dict) -> Any:
    """Throughput and weak-scaling efficiency of ``model`` (a report's model entry) against
    ranks, with ideal scaling (n x hpcrep's 1-rank throughput; efficiency 1)."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    runs = model["runs"]
    ranks = sorted({int(n) for r in runs.values() for n in r})
    base_mode = "hpcrep" if "1" in runs.get("hpcrep", {}) else next(
        (m for m, r in runs.items() if "1" in r), None)
    if base_mode is not None and runs[base_mode]["1"].get("throughput"):
        one = runs[base_mode]["1"]["throughput"]
        ax1.plot(ranks, [n * one for n in ranks], **IDEAL,
                 label=f"ideal (n x 1-rank {peer_name(base_mode)})")
    ax2.plot(ranks, [1.0] * len(ranks), **IDEAL, label="ideal")
    for mode, by_n in runs.items():
        # a variant that failed its self-check has no figures
        ns = sorted((n for n in by_n if by_n[n].get("throughput") is not None), key=int)
        style = {"color": colour(mode), "marker": "o", "label": peer_name(mode)}
        ax1.plot([int(n) for n in ns], [by_n[n]["throughput"] for n in ns], **style)
        eff = [(int(n), by_n[n]["efficiency"]) for n in ns if by_n[n].get("efficiency") is not None]
        if eff:
            ax2.plot(*zip(*eff), **style)
    for ax in (ax1, ax2):
        set_rank_axis(ax, ranks)
    ax1.set(ylabel=model.get("unit", "throughput"), title=f"{name}: throughput")
    top = max([1.2] + [1.1 * r["efficiency"] for by_n in runs.values() for r in by_n.values()
                       if r.get("efficiency") is not None])  # superlinear points stay visible
    ax2.set(ylabel="efficiency vs 1 rank (same cores per rank)",
            title=f"{name}: weak-scaling efficiency", ylim=(0, top))
    return fig


def allreduce_figure(allreduce: dict) -> Any:
    """Allreduce bandwidth against message size: raw mpi4py in the raw-MPI colour, hpcrep in
    hpcrep's; line style says which path, marker which rank count."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "os^vD"
    for i, (n, run) in enumerate(sorted(allreduce["runs"].items(), key=lambda kv: int(kv[0]))):
        rows = run["sizes"]
        sizes = [r["bytes"] for r in rows]
        for key, peer, style, label in (("raw_inplace_ms", "mpi4py", "-", "raw mpi4py in place"),
                                        ("hpcrep_numpy_ms", "hpcrep", "--", "hpcrep numpy"),
                                        ("hpcrep_tf_ms", "hpcrep", ":", "hpcrep tf.function")):
            ax.plot(sizes, [r["bytes"] / (r[key] / 1e3) / 1e9 for r in rows], style,
                    color=colour(peer), marker=markers[i % len(markers)],
                    label=f"{n} ranks, {label}")
    if allreduce.get("memcpy_gbps"):
        ax.axhline(allreduce["memcpy_gbps"], **IDEAL, label="memcpy ceiling (measured)")
    ax.set(xscale="log", yscale="log", xlabel="message bytes", ylabel="GB/s (bytes / time)",
           title="allreduce bandwidth vs message size")
    return fig


def projection_figure(proj: dict) -> Any:
    """Projected efficiency against ranks, one colour per model; a dashed line is the measured
    overlap row where there is one."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, m in proj["models"].items():
        ax.plot(proj["ranks"], m["rows"]["fused"], "o-", color=colour(name, MODEL_COLOURS),
                label=f"{name}")
        if "measured_overlap" in m["rows"]:
            ax.plot(proj["ranks"], m["rows"]["measured_overlap"], "s--",
                    color=colour(name, MODEL_COLOURS), label=f"{name}, measured overlap")
    set_rank_axis(ax, proj["ranks"])
    ax.set(ylabel="projected efficiency", ylim=(0, 1.05),
           title=f"hpcrep projected on {proj['network']['bandwidth_gbps']} GB/s, "
                 f"{proj['network']['latency_us']} us")
    return fig


def plot_model(name: str, model: dict, out: str) -> str:
    """Write ``<out>/<name>_scaling.png``; return its path."""
    return save(model_figure(name, model), os.path.join(out, f"{name}_scaling.png"))


def plot_allreduce(allreduce: dict, out: str) -> Optional[str]:
    """Write ``<out>/allreduce_bandwidth.png`` if the allreduce benchmark has results."""
    if not allreduce.get("runs"):
        return None
    return save(allreduce_figure(allreduce), os.path.join(out, "allreduce_bandwidth.png"))


def plot_projection(proj: dict, out: str) -> Optional[str]:
    """Write ``<out>/projection.png`` if there is a projection with models."""
    if not proj.get("models"):
        return None
    return save(projection_figure(proj), os.path.join(out, "projection.png"))


def save(fig: Any, path: str) -> str:
    """Add grid and legend to every axis of ``fig``, write it to ``path`` as PNG, close it."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt
