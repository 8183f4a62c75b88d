"""Turn benchmark results (``report.json``) into derived figures, Markdown and PNG plots.

:func:`derive` adds efficiencies, hpcrep-vs-peer ratios and the projection to a report dict;
:func:`render` writes ``report.md`` and the plots (:mod:`bench.plots`); ``hpcrep report DIR``
calls both again.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from bench import plots
from bench.placement import oversubscribed
from bench.plots import PEER_NAMES
from bench.projection import project

# Peers in the order the summary table shows them, hpcrep first.
SUMMARY_PEERS = ("nosync", "mpi4py", "horovod", "mwms")
SHORT_NAMES = {"nosync": "no-sync", "mpi4py": "raw MPI", "horovod": "Horovod", "mwms": "MWMS"}


def weak_scaling_efficiency(throughput: float, ranks: int, base_throughput: Optional[float],
                            threads: Optional[int] = None,
                            base_threads: Optional[int] = None) -> Optional[float]:
    """Weak-scaling efficiency: ``throughput / (ranks x base_throughput)``, the 1-rank throughput
    at the same cores per rank.

    None when there is no baseline, or when the two runs' threads per rank are not both known
    and equal (comparing them would mix rank scaling with thread scaling).
    """
    if not base_throughput or threads is None or threads != base_threads:
        return None
    return throughput / (ranks * base_throughput)


def derive(report: dict) -> None:
    """Add ``efficiency`` to every run, ``ratios`` to every model and ``projection``, in place.

    A ratio is hpcrep's throughput over the peer's at the same rank count; where hpcrep was
    timed in the same job as the peer (``paired``, e.g. Horovod), that hpcrep run is used.
    """
    for model in report["models"].values():
        runs = model.get("runs", {})
        for by_n in runs.values():
            base = by_n.get("1", {})
            for n, r in by_n.items():
                r["efficiency"] = weak_scaling_efficiency(
                    r["throughput"], int(n), base.get("throughput"), r.get("threads_per_rank"),
                    base.get("threads_per_rank"))
        model["ratios"] = {}
        for peer, by_n in runs.items():
            if peer == "hpcrep":
                continue
            ours = model.get("paired", {}).get(peer) or runs.get("hpcrep", {})
            model["ratios"][peer] = {n: ours[n]["throughput"] / r["throughput"]
                                     for n, r in by_n.items()
                                     if n in ours and r["throughput"]}
    report.setdefault("fusion_threshold", _fusion_threshold())
    software, memcpy = _allreduce_facts(report.get("allreduce") or {})
    inputs = {}
    for name, model in report["models"].items():
        runs = model.get("runs", {})
        one = runs.get("nosync", {}).get("1") or runs.get("hpcrep", {}).get("1")
        if one and model.get("grad_bytes"):
            inputs[name] = {"compute_ms": one["step_ms"], "grad_bytes": model["grad_bytes"],
                            "grad_tensors": model.get("grad_tensors", 1),
                            "syncs_per_step": model.get("syncs_per_step", 1)}
            if model.get("overlap_fraction") is not None:
                inputs[name]["overlap_fraction"] = float(model["overlap_fraction"])
    report["projection"] = project(inputs, software, memcpy, report["fusion_threshold"])


def derived_by_older_version(report: dict) -> bool:
    """True if ``report`` has no derived figures, or ones in the layout of an older hpcrep (a
    projection from before measured-only parameters), so :func:`derive` must run before
    :func:`render`."""
    proj = report.get("projection")
    return proj is None or ("omitted" not in proj and "capped_by_memcpy" not in proj)


def _fusion_threshold() -> int:
    from hpcrep import config  # noqa: PLC0415

    return int(config.get("HPCREP_FUSION_THRESHOLD"))


def _allreduce_facts(allreduce: dict) -> tuple[Optional[float], Optional[float]]:
    """(software overhead ms, memcpy GB/s) measured by the allreduce benchmark, None if not."""
    memcpy = float(allreduce["memcpy_gbps"]) if allreduce.get("memcpy_gbps") else None
    runs = allreduce.get("runs") or {}
    if not runs:
        return None, memcpy
    run = runs[min(runs, key=int)]
    software = run.get("latency_1kb_tf_ms", run.get("latency_1kb", {}).get("hpcrep_tf_ms"))
    return (float(software) if software else None), memcpy


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(report: dict) -> list[list[str]]:
    """The summary table: per model and rank count, hpcrep's efficiency and hpcrep/peer ratios.
    The first row is the header."""
    peers = [p for p in SUMMARY_PEERS
             if any(p in m.get("ratios", {}) for m in report["models"].values())]
    rows = [["model", "ranks", "hpcrep efficiency"] + [f"hpcrep/{SHORT_NAMES[p]}" for p in peers]]
    for name, model in report["models"].items():
        ours = model.get("runs", {}).get("hpcrep", {})
        ranks = sorted({n for by_n in model.get("runs", {}).values() for n in by_n}, key=int)
        for n in ranks:
            eff = ours.get(n, {}).get("efficiency")
            rows.append([name, n, _fmt(eff, ".2f")] + [
                _fmt(model.get("ratios", {}).get(p, {}).get(n), ".2f") for p in peers])
    return rows


def _cores_line(report: dict) -> str:
    cpr = report.get("cores_per_rank")
    if cpr is None:
        return ("Cores per rank: not recorded (a report from before --cores-per-rank: its runs "
                "mixed rank scaling with thread scaling, so no efficiency is computed).")
    cores = report["machine"].get("cores") or 0
    over = [n for n in report.get("ranks", []) if oversubscribed(cores, cpr, int(n))]
    text = (f"Cores per rank: {cpr} (TensorFlow intra-op threads) at every rank count, "
            f"{cores} cores on the machine")
    if over:
        text += f"; oversubscribed (ranks x cores per rank > cores) at {over} ranks"
    return text + "."


def summary(report: dict) -> str:
    """A few lines for the terminal: the summary table, cores per rank and Horovod's status."""
    rows = summary_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(_cores_line(report))
    hv = report["peers"].get("horovod", {})
    status = hv.get("status", "?")
    if status == "importable":
        lines.append(f"horovod: {hv.get('version', '')} from {hv.get('python')}")
    else:
        lines.append(f"horovod: {status}; to build it: {hv.get('how_to_build', 'make peers')}")
    if report.get("errors"):
        lines.append(f"{len(report['errors'])} job(s) failed: see report.md")
    return "\n".join(lines)


def render(report: dict, out: str) -> list[str]:
    """Write ``report.md`` and the PNG plots into ``out``; return their paths."""
    paths = [plots.plot_model(name, model, out) for name, model in report["models"].items()
             if model.get("runs")]
    paths.append(plots.plot_allreduce(report.get("allreduce") or {}, out))
    paths.append(plots.plot_projection(report["projection"], out))
    paths = [p for p in paths if p]
    md = os.path.join(out, "report.md")
    with open(md, "w") as f:
        f.write(markdown(report, [os.path.basename(p) for p in paths]))
    return [md] + paths


def markdown(report: dict, images: list[str]) -> str:
    """The Markdown text of a report."""
    m, v = report["machine"], report["versions"]
    rows = summary_rows(report)
    lines = [f"# hpcrep scaling benchmark ({report['created']})", "",
             f"Machine: {m.get('host')}, {m.get('cores')} cores ({m.get('cpu')}), "
             f"{m.get('memory_gib')} GiB; load average at start {m.get('load_average')} (other "
             "work on the machine shows up as noise in every figure).",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
             _cores_line(report),
             f"Mode: {'quick' if report.get('quick') else 'full'}; weak scaling (fixed per-rank "
             "batch); efficiency = throughput(n) / (n x throughput(1)) of the same variant at the "
             "same cores per rank (checked per run: '-' where the threads differ or were not "
             "recorded); warm-up steps excluded; each figure is the median over timed steps of "
             f"the slowest rank. Took {report.get('seconds', 0):.0f} s.", "",
             "## Summary", "", "| " + " | ".join(rows[0]) + " |",
             "|---|" + "---:|" * (len(rows[0]) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]] + [""]
    for name, model in report["models"].items():
        lines += _model_md(name, model)
    lines += _horovod_md(report)
    lines += _allreduce_md(report.get("allreduce") or {})
    lines += _projection_md(report["projection"])
    if report.get("errors"):
        lines += ["## Failed jobs", ""] + [f"```\n{e}\n```" for e in report["errors"]] + [""]
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images] + [""]
    return "\n".join(lines)


def _model_md(name: str, model: dict) -> list[str]:
    lines = [f"## {name}", "", f"Throughput in {model.get('unit', '?')}; gradients: "
             f"{model.get('grad_tensors', '?')} tensors, "
             f"{(model.get('grad_bytes') or 0) / 1e6:.2f} MB per exchange, "
             f"{model.get('syncs_per_step', 1)} exchange(s) per step.", "",
             "| variant | ranks | threads per rank | throughput | step ms | comm ms | compute ms "
             "| comm fraction | efficiency vs 1 rank |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, runs in model.get("runs", {}).items():
        for n, r in runs.items():
            lines.append(
                f"| {PEER_NAMES.get(mode, mode)} | {n} | {_fmt(r.get('threads_per_rank'), 'd')} "
                f"| {_fmt(r['throughput'])} | {_fmt(r['step_ms'])} | {_fmt(r.get('comm_ms'))} | "
                f"{_fmt(r.get('compute_ms'))} | {_fmt(r.get('comm_fraction'), '.2f')} | "
                f"{_fmt(r.get('efficiency'), '.2f')} |")
    if model.get("ratios"):
        lines += ["", "hpcrep throughput / peer throughput:", ""]
        for peer, ratios in model["ratios"].items():
            paired = " (hpcrep timed in the same job)" if peer in model.get("paired", {}) else ""
            lines.append(f"- {PEER_NAMES.get(peer, peer)}{paired}: " + ", ".join(
                f"{n} ranks {val:.2f}x" for n, val in ratios.items()))
    return lines + [""]


def _horovod_md(report: dict) -> list[str]:
    hv = report["peers"].get("horovod", {})
    lines = ["## Horovod", ""]
    if hv.get("status") != "importable":
        return lines + [f"Status: {hv.get('status')}"
                        + (f" ({hv['error']})" if hv.get("error") else "")
                        + f". To build it: {hv.get('how_to_build', 'make peers')}.", ""]
    lines += [f"Horovod {hv.get('version')} ({hv.get('python')}), built from its sdist by "
              "`make peers`. In one job per rank count, under that Python, the same step is timed "
              "with hpcrep's synchroniser and with `horovod.tensorflow.grouped_allreduce` "
              "(op=Average); the ratio compares those two.", "",
              "| model | ranks | hpcrep | Horovod | hpcrep/Horovod |", "|---|---:|---:|---:|---:|"]
    for name, model in report["models"].items():
        theirs = model.get("runs", {}).get("horovod", {})
        ours = model.get("paired", {}).get("horovod", {})
        for n in sorted(theirs, key=int):
            ratio = model.get("ratios", {}).get("horovod", {}).get(n)
            lines.append(f"| {name} | {n} | {_fmt(ours.get(n, {}).get('throughput'))} | "
                         f"{_fmt(theirs[n]['throughput'])} | {_fmt(ratio, '.2f')} |")
    return lines + [""]


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
    lines = ["## Projection", ""]
    if "omitted" in proj:
        return lines + [f"Omitted: {proj['omitted']}.", ""]
    net = proj["network"]
    if proj["capped_by_memcpy"]:
        bandwidth = (f"effective bandwidth {proj['effective_bandwidth_gbps']:.1f} GB/s (capped by "
                     f"memcpy {proj['memcpy_gbps']:.1f} GB/s measured here)")
    elif proj.get("memcpy_gbps"):
        bandwidth = (f"memcpy measured here ({proj['memcpy_gbps']:.1f} GB/s) does not cap the "
                     "network bandwidth")
    else:
        bandwidth = "memcpy not measured in this run, so the bandwidth is not capped by it"
    overlap = any("measured_overlap" in m["rows"] for m in proj["models"].values())
    lines += [f"What hpcrep does today, with parameters measured in this run. Network (stated, "
              f"not measured): {net['name']}: {net['bandwidth_gbps']} GB/s, {net['latency_us']} "
              f"us per message; {bandwidth}. Software overhead {proj['software_ms']:.3f} ms per "
              "exchange (measured: 1 KB allreduce inside tf.function). Gradients travel in "
              f"fusion buffers of at most {proj['fusion_threshold'] / 2 ** 20:.0f} MiB, one ring "
              "allreduce each: t = t_sw + 2(p-1)/p * B/bw + buffers * 2(p-1) * latency; compute "
              "per step = the 1-rank no-sync step measured here. "
              + ("A 'measured overlap' row hides the share of communication that this run "
                 "measured as hidden behind compute." if overlap else
                 "No overlap row: this run measured no overlap of communication with compute."),
              "", "| model | buffers | row | " + " | ".join(str(p) for p in proj["ranks"]) + " |",
              "|---|---:|---|" + "---:|" * len(proj["ranks"])]
    for name, m in proj["models"].items():
        for key, row in m["rows"].items():
            lines.append(f"| {name} | {m['buffers']} | {key.replace('_', ' ')} | "
                         + " | ".join(f"{e:.2f}" for e in row) + " |")
    return lines + [""]
