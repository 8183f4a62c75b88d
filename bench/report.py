"""Turn benchmark results (``report.json``) into derived figures, Markdown and PNG plots.

:func:`derive` adds efficiencies, hpcrep-vs-peer ratios and the projection to a report dict;
:func:`render` writes ``report.md`` and the plots; ``hpcrep report DIR`` calls both again.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from bench.projection import project

PEER_NAMES = {"nosync": "no-sync upper bound", "mpi4py": "raw mpi4py allreduce",
              "mwms": "tf.distribute MultiWorkerMirroredStrategy", "hpcrep": "hpcrep",
              "horovod": "Horovod"}
DEFAULT_SOFTWARE_MS = 0.3  # one tf.numpy_function call (measured), used if no allreduce run


def derive(report: dict) -> None:
    """Add ``efficiency`` to every run, ``ratios`` to every model and ``projection``, in place.

    Efficiency (weak scaling) is throughput(n) / (n x throughput(1)) of the same variant; a ratio
    is hpcrep's throughput over the peer's at the same rank count.
    """
    for model in report["models"].values():
        for runs in model.get("runs", {}).values():
            base = runs.get("1", {}).get("throughput")
            for n, r in runs.items():
                r["efficiency"] = r["throughput"] / (int(n) * base) if base else None
        ours = model.get("runs", {}).get("hpcrep", {})
        model["ratios"] = {
            peer: {n: ours[n]["throughput"] / r["throughput"]
                   for n, r in runs.items() if n in ours and r["throughput"]}
            for peer, runs in model.get("runs", {}).items() if peer != "hpcrep"}
    memcpy, software = _allreduce_facts(report.get("allreduce") or {})
    inputs = {}
    for name, model in report["models"].items():
        one = model.get("runs", {}).get("nosync", {}).get("1") or model.get(
            "runs", {}).get("hpcrep", {}).get("1")
        if one and model.get("grad_bytes"):
            inputs[name] = {"compute_ms": one["step_ms"], "grad_bytes": model["grad_bytes"],
                            "syncs_per_step": model.get("syncs_per_step", 1)}
    report["projection"] = project(inputs, memcpy, software)


def _allreduce_facts(allreduce: dict) -> tuple[float, float]:
    memcpy = float(allreduce.get("memcpy_gbps") or 0.0)
    runs = allreduce.get("runs") or {}
    if not runs:
        return memcpy, DEFAULT_SOFTWARE_MS
    run = runs[min(runs, key=int)]
    if "latency_1kb_tf_ms" in run:
        return memcpy, float(run["latency_1kb_tf_ms"])
    return memcpy, float(run.get("latency_1kb", {}).get("hpcrep_tf_ms", DEFAULT_SOFTWARE_MS))


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary(report: dict) -> str:
    """A few lines for the terminal: efficiency at each rank count and hpcrep/peer ratios."""
    lines = []
    for name, model in report["models"].items():
        ours = model.get("runs", {}).get("hpcrep", {})
        eff = ", ".join(f"{n} ranks {_fmt(r.get('efficiency'), '.2f')}" for n, r in ours.items())
        lines.append(f"{name}: hpcrep efficiency vs 1 rank: {eff or 'no runs'}")
        for peer, ratios in model.get("ratios", {}).items():
            text = ", ".join(f"{n} ranks {v:.2f}x" for n, v in ratios.items())
            lines.append(f"  hpcrep / {PEER_NAMES.get(peer, peer)}: {text}")
    lines.append(f"horovod: {report['peers'].get('horovod', {}).get('status', '?')}")
    if report.get("errors"):
        lines.append(f"{len(report['errors'])} job(s) failed: see report.md")
    return "\n".join(lines)


def render(report: dict, out: str) -> list[str]:
    """Write ``report.md`` and the PNG plots into ``out``; return their paths."""
    paths = [_plot_model(name, model, out) for name, model in report["models"].items()
             if model.get("runs")]
    paths.append(_plot_allreduce(report.get("allreduce") or {}, out))
    paths.append(_plot_projection(report["projection"], out))
    paths = [p for p in paths if p]
    md = os.path.join(out, "report.md")
    with open(md, "w") as f:
        f.write(markdown(report, [os.path.basename(p) for p in paths]))
    return [md] + paths


def markdown(report: dict, images: list[str]) -> str:
    """The Markdown text of a report."""
    m, v = report["machine"], report["versions"]
    lines = [f"# hpcrep scaling benchmark ({report['created']})", "",
             f"Machine: {m.get('host')}, {m.get('cores')} cores ({m.get('cpu')}), "
             f"{m.get('memory_gib')} GiB; load average at start {m.get('load_average')}.",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
             f"Mode: {'quick' if report.get('quick') else 'full'}; weak scaling (fixed per-rank "
             f"batch), TF threads per rank = cores // ranks; warm-up steps excluded; each figure "
             f"is the median over timed steps of the slowest rank. "
             f"Took {report.get('seconds', 0):.0f} s.",
             ""]
    for name, model in report["models"].items():
        lines += [f"## {name}", "", f"Throughput in {model.get('unit', '?')}; gradients: "
                  f"{model.get('grad_tensors', '?')} tensors, "
                  f"{(model.get('grad_bytes') or 0) / 1e6:.2f} MB per exchange, "
                  f"{model.get('syncs_per_step', 1)} exchange(s) per step.", "",
                  "| variant | ranks | throughput | step ms | comm ms | compute ms | comm fraction "
                  "| efficiency vs 1 rank |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for mode, runs in model.get("runs", {}).items():
            for n, r in runs.items():
                lines.append(
                    f"| {PEER_NAMES.get(mode, mode)} | {n} | {_fmt(r['throughput'])} | "
                    f"{_fmt(r['step_ms'])} | {_fmt(r.get('comm_ms'))} | {_fmt(r.get('compute_ms'))}"
                    f" | {_fmt(r.get('comm_fraction'), '.2f')}"
                    f" | {_fmt(r.get('efficiency'), '.2f')} |")
        if model.get("ratios"):
            lines += ["", "hpcrep throughput / peer throughput:", ""]
            for peer, ratios in model["ratios"].items():
                lines.append(f"- {PEER_NAMES.get(peer, peer)}: " + ", ".join(
                    f"{n} ranks {val:.2f}x" for n, val in ratios.items()))
        lines.append("")
    hv = report["peers"].get("horovod", {})
    lines += ["## Horovod", "",
              f"Status: {hv.get('status')} ({hv.get('error', hv.get('path', ''))})."
              " How to build it: bench/README.md.", ""]
    lines += _allreduce_md(report.get("allreduce") or {})
    lines += _projection_md(report["projection"])
    if report.get("errors"):
        lines += ["## Failed jobs", ""] + [f"```\n{e}\n```" for e in report["errors"]] + [""]
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images] + [""]
    return "\n".join(lines)


def _allreduce_md(allreduce: dict) -> list[str]:
    if not allreduce:
        return []
    if "error" in allreduce:
        return ["## Allreduce benchmark", "", f"Failed: {allreduce['error']}", ""]
    lines = ["## Allreduce benchmark", "", f"memcpy ceiling {allreduce['memcpy_gbps']:.1f} GB/s. "
             "Full tables: [allreduce.md](allreduce.md).", ""]
    for n, run in allreduce.get("runs", {}).items():
        r50 = run.get("resnet50")
        if r50:
            lines.append(f"- {n} ranks, ResNet-50 gradient set ({r50['bytes'] / 1e6:.0f} MB): "
                         f"hpcrep tf.function {r50['hpcrep_tf_ms']:.1f} ms, raw mpi4py in-place "
                         f"{r50['raw_inplace_ms']:.1f} ms "
                         f"({r50['hpcrep_tf_ms'] / r50['raw_inplace_ms']:.2f}x).")
    return lines + [""]


def _projection_md(proj: dict) -> list[str]:
    net = proj["network"]
    lines = ["## Projection", "",
             f"Network: {net['name']}: {net['bandwidth_gbps']} GB/s, {net['latency_us']} us per "
             f"message; effective bandwidth {proj['effective_bandwidth_gbps']:.1f} GB/s (capped by "
             f"memcpy {proj['memcpy_gbps']:.1f} GB/s measured here); software overhead "
             f"{proj['software_ms']:.3f} ms per allreduce (measured). Ring allreduce "
             "t = t_sw + 2(p-1)/p * B/bw + 2(p-1) * latency; compute per step = the 1-rank "
             "no-sync step measured here; overlap hides communication behind the backward pass "
             f"({proj['backward_fraction']:.2f} of a step).", "",
             "| model | overlap | " + " | ".join(str(p) for p in proj["ranks"]) + " |",
             "|---|---|" + "---:|" * len(proj["ranks"])]
    for name, m in proj["models"].items():
        for key in ("no_overlap", "overlap"):
            lines.append(f"| {name} | {key.replace('_', ' ')} | "
                         + " | ".join(f"{e:.2f}" for e in m[key]) + " |")
    return lines + [""]


def _pyplot():
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save_figure(fig, axes, path: str) -> str:
    """Add grid and legend to ``axes``, write ``fig`` to ``path`` as PNG, close it; return path."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def _plot_model(name: str, model: dict, out: str) -> str:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, runs in model["runs"].items():
        ns = sorted(runs, key=int)
        ax1.plot([int(n) for n in ns], [runs[n]["throughput"] for n in ns], "o-",
                 label=PEER_NAMES.get(mode, mode))
        eff = [(int(n), runs[n].get("efficiency")) for n in ns if runs[n].get("efficiency")]
        if eff:
            ax2.plot(*zip(*eff), "o-", label=PEER_NAMES.get(mode, mode))
    ax1.set(xlabel="ranks", ylabel=model.get("unit", "throughput"), title=f"{name}: throughput")
    ax2.set(xlabel="ranks", ylabel="efficiency vs 1 rank", title=f"{name}: weak-scaling efficiency",
            ylim=(0, 1.2))
    return _save_figure(fig, (ax1, ax2), os.path.join(out, f"{name}_scaling.png"))


def _plot_allreduce(allreduce: dict, out: str) -> Optional[str]:
    if not allreduce.get("runs"):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, run in allreduce["runs"].items():
        rows = run["sizes"]
        sizes = [r["bytes"] for r in rows]
        for key, style in (("raw_inplace_ms", "-"), ("hpcrep_numpy_ms", "--"),
                           ("hpcrep_tf_ms", ":")):
            ax.plot(sizes, [r["bytes"] / (r[key] / 1e3) / 1e9 for r in rows], style, marker="o",
                    label=f"{n} ranks {key[:-3]}")
    ax.axhline(allreduce["memcpy_gbps"], color="k", lw=1, label="memcpy ceiling")
    ax.set(xscale="log", xlabel="message bytes", ylabel="GB/s (bytes / time)",
           title="allreduce bandwidth vs message size")
    return _save_figure(fig, (ax,), os.path.join(out, "allreduce_bandwidth.png"))


def _plot_projection(proj: dict, out: str) -> Optional[str]:
    if not proj["models"]:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, m in proj["models"].items():
        line, = ax.plot(proj["ranks"], m["no_overlap"], "o-", label=f"{name} no overlap")
        ax.plot(proj["ranks"], m["overlap"], "s--", color=line.get_color(),
                label=f"{name} overlap")
    ax.set(xscale="log", xlabel="ranks", ylabel="projected efficiency", ylim=(0, 1.05),
           title=f"projection on {proj['network']['bandwidth_gbps']} GB/s, "
                 f"{proj['network']['latency_us']} us")
    ax.set_xticks(proj["ranks"], [str(p) for p in proj["ranks"]])
    return _save_figure(fig, (ax,), os.path.join(out, "projection.png"))
