"""Turn benchmark results (``report.json``) into derived figures, Markdown and PNG plots.

:func:`derive` adds efficiencies, hpcrep-vs-peer ratios and the projection to a report dict;
:func:`render` writes ``report.md`` and the plots (:mod:`bench.plots`); ``hpcrep report DIR``
calls both again.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from bench import plots
from bench.placement import oversubscribed
from bench.plots import PEER_NAMES
from bench.projection import project

# Peers in the order the summary table shows them, no-sync first.
SUMMARY_PEERS = ("nosync", "mpi4py", "horovod", "mwms")
SHORT_NAMES = {"nosync": "no-sync", "mpi4py": "raw MPI", "horovod": "Horovod", "mwms": "MWMS"}
# Peers timed in jobs of their own, each against that job's own nosync.
OWN_JOB_PEERS = ("horovod", "mwms")


def fmt_spread(median: Optional[float], lo: Optional[float] = None,
               hi: Optional[float] = None) -> str:
    """A figure with its min-max, printed with the precision its spread allows: rounded to the
    decimal place of the spread's leading digit, or of the min's where that is finer (the median
    to nearest, the min down and the max up), e.g. ``160 [120-190]`` for 155 in [124, 186],
    ``1.00 [0.98-1.02]`` for 1.0 in [0.985, 1.015] and ``300 [40-400]`` for 300 in [43, 400].
    Without a spread (none given, or min = max) three significant digits; '-' for None."""
    if median is None:
        return "-"
    if lo is None or hi is None or not hi > lo:
        return format(median, ".3g")
    place = math.floor(math.log10(hi - lo))
    if lo > 0:  # never round the min away to 0: keep its leading digit too
        place = min(place, math.floor(math.log10(lo)))
    decimals = max(0, -place)
    unit = 10.0 ** place

    def show(x: float) -> str:
        return f"{x:.{decimals}f}"
    low = math.floor(lo / unit + 1e-9) * unit
    high = math.ceil(hi / unit - 1e-9) * unit
    return f"{show(round(median / unit) * unit)} [{show(low)}-{show(high)}]"


def fmt_figure(value: Any) -> str:
    """:func:`fmt_spread` of a ``{"median", "min", "max"}`` dict (or a bare number)."""
    if isinstance(value, dict):
        return fmt_spread(value.get("median"), value.get("min"), value.get("max"))
    return fmt_spread(value)


def ratio_of(a: dict, b: dict) -> dict:
    """``a / b`` for two independent figures with spreads (``{"median", "min", "max"}``): the
    medians' ratio, the least ``a.min / b.max`` and the most ``a.max / b.min``."""
    return {"median": a["median"] / b["median"], "min": a["min"] / b["max"],
            "max": a["max"] / b["min"]}


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
    """Add ``efficiency`` to every run, ``ratios`` to every model, ``projection`` and its
    ``checked`` points, in place.

    A ratio is hpcrep's throughput over the peer's at the same rank count, as a median with
    min-max (:func:`peer_ratio`).
    """
    for model in report["models"].values():
        runs = model.get("runs", {})
        for by_n in runs.values():
            base = by_n.get("1", {})
            for n, r in by_n.items():
                r["efficiency"] = None if r.get("throughput") is None else \
                    weak_scaling_efficiency(r["throughput"], int(n), base.get("throughput"),
                                            r.get("threads_per_rank"),
                                            base.get("threads_per_rank"))
        model["ratios"] = {}
        for peer in runs:
            if peer == "hpcrep":
                continue
            ratios = {n: peer_ratio(model, peer, n) for n in runs[peer]}
            model["ratios"][peer] = {n: r for n, r in ratios.items() if r is not None}
    report.setdefault("fusion_threshold", _fusion_threshold())
    software, memcpy = _allreduce_facts(report.get("allreduce") or {})
    inputs = {}
    for name, model in report["models"].items():
        runs = model.get("runs", {})
        one = runs.get("nosync", {}).get("1") or runs.get("hpcrep", {}).get("1")
        if one and one.get("step_ms") and model.get("grad_bytes"):
            inputs[name] = {"compute_ms": one["step_ms"], "grad_bytes": model["grad_bytes"],
                            "grad_tensors": model.get("grad_tensors", 1),
                            "syncs_per_step": model.get("syncs_per_step", 1)}
            if model.get("overlap_fraction") is not None:
                inputs[name]["overlap_fraction"] = float(model["overlap_fraction"])
    report["projection"] = project(inputs, software, memcpy, report["fusion_threshold"])
    measured = sorted({int(n) for m in report["models"].values()
                       for by_n in m.get("runs", {}).values() for n in by_n})
    report["projection"]["checked"] = check_points(
        inputs, software, memcpy, report["fusion_threshold"], measured, report.get("cluster"))


def peer_ratio(model: dict, peer: str, n: str) -> Optional[dict]:
    """hpcrep's throughput over ``peer``'s at ``n`` ranks, ``{"median", "min", "max"}``, or None
    where either has no figure (not run, or failed its self-check).

    - ``nosync``: hpcrep's ``vs_nosync`` (per-round ratio in the same job);
    - a peer in hpcrep's job (raw MPI): the per-round ratio of their step times;
    - a peer in a job of its own (Horovod, MWMS): hpcrep over its job's nosync, divided by the
      peer over its own job's nosync (:func:`ratio_of`), so that each is measured against the
      unsynchronised step of its own process and minute.

    Reports without per-round times fall back to the throughput ratio (no spread).
    """
    from bench.job import round_ratio  # noqa: PLC0415

    ours = model.get("runs", {}).get("hpcrep", {}).get(n) or {}
    theirs = model.get("runs", {}).get(peer, {}).get(n) or {}
    if ours.get("throughput") is None or theirs.get("throughput") is None:
        return None
    if peer == "nosync" and ours.get("vs_nosync"):
        return dict(ours["vs_nosync"])
    if peer in OWN_JOB_PEERS:
        own = model.get("peer_jobs", {}).get(peer, {}).get(n, {}).get("nosync")
        if ours.get("vs_nosync") and theirs.get("vs_nosync") and own:
            return ratio_of(ours["vs_nosync"], theirs["vs_nosync"])
        paired = model.get("paired", {}).get(peer, {}).get(n)  # reports from before
        ours = paired or ours
    elif ours.get("round_ms") and theirs.get("round_ms") and \
            len(ours["round_ms"]) == len(theirs["round_ms"]):
        return round_ratio(theirs["round_ms"], ours["round_ms"])
    value = ours["throughput"] / theirs["throughput"] if theirs["throughput"] else None
    return None if value is None else {"median": value, "min": value, "max": value}


# What the model is checked with at the measured points: ranks on one node exchange through
# shared memory (bandwidth: memcpy measured here; latency stated), ranks on the test cluster's
# nodes through its link (stated rate, capped by memcpy; latency stated).
SHARED_MEMORY_LATENCY_US = 1.0
TCP_LATENCY_US = 50.0


def check_points(inputs: dict, software_ms: Optional[float], memcpy_gbps: Optional[float],
                 fusion_threshold: int, ranks: list[int],
                 cluster: Optional[dict] = None) -> dict:
    """The projection's model evaluated at the rank counts this run measured, on the network
    they really ran on: one node (shared memory at the memcpy bandwidth measured here), or the
    test cluster's link when the run had one (``cluster["link"]`` like ``"2gbit"``).

    Returns ``{"network": ..., "models": name -> {n: efficiency}}``, or ``{"omitted": why}``.
    """
    if not software_ms or not memcpy_gbps:
        return {"omitted": "needs the allreduce benchmark's software overhead and memcpy "
                           "bandwidth from this run"}
    link = _link_gbytes(cluster)
    if link is not None:
        network = {"name": f"test cluster link {cluster.get('link')}",
                   "bandwidth_gbps": min(link, memcpy_gbps), "latency_us": TCP_LATENCY_US}
    else:
        network = {"name": "one node, shared memory", "bandwidth_gbps": memcpy_gbps,
                   "latency_us": SHARED_MEMORY_LATENCY_US}
    proj = project(inputs, software_ms, None, fusion_threshold, network=network,
                   ranks=[r for r in ranks if r > 1] or [2])
    return {"network": network, "models": {
        name: {str(p): e for p, e in zip(proj["ranks"], m["rows"]["fused"])}
        for name, m in proj.get("models", {}).items()}}


def _link_gbytes(cluster: Optional[dict]) -> Optional[float]:
    """The cluster's link rate in GB/s (``"2gbit"`` -> 0.25), None without a capped link."""
    link = str((cluster or {}).get("link") or "").lower()
    scale = {"gbit": 1 / 8, "mbit": 1 / 8000}
    unit = next((u for u in scale if link.endswith(u)), None)
    if not (cluster or {}).get("nodes") or unit is None:
        return None
    try:
        return float(link[:-len(unit)]) * scale[unit]
    except ValueError:
        return None


def derived_by_older_version(report: dict) -> bool:
    """True if ``report`` has no derived figures, or ones in the layout of an older hpcrep (a
    projection from before measured-only parameters, or without its model checked at the
    measured points), so :func:`derive` must run before :func:`render`."""
    proj = report.get("projection")
    return proj is None or "checked" not in proj or (
        "omitted" not in proj and "capped_by_memcpy" not in proj)


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
    """The summary table: per model and rank count, hpcrep's throughput over no-sync's (the
    figure machine contention cancels out of) first, then over each peer's, then hpcrep's
    efficiency vs 1 rank, and the self-checks. Figures are medians with min-max over rounds.
    The first row is the header."""
    peers = [p for p in SUMMARY_PEERS
             if any(p in m.get("ratios", {}) for m in report["models"].values())]
    rows = [["model", "ranks"] + [f"hpcrep/{SHORT_NAMES[p]}" for p in peers]
            + ["hpcrep efficiency vs 1 rank", "self-checks"]]
    for name, model in report["models"].items():
        ours = model.get("runs", {}).get("hpcrep", {})
        ranks = sorted({n for by_n in model.get("runs", {}).values() for n in by_n}, key=int)
        for n in ranks:
            eff = ours.get(n, {}).get("efficiency")
            rows.append([name, n] + [fmt_figure(model.get("ratios", {}).get(p, {}).get(n))
                                     for p in peers]
                        + [_fmt(eff, ".2f"), _checks_cell(model, n)])
    return rows


def _checks_cell(model: dict, n: str) -> str:
    """'ok', or the variants that failed their self-check at ``n`` ranks, or '-' (unchecked)."""
    failed, checked = [], False
    for mode, by_n in model.get("runs", {}).items():
        check = (by_n.get(n) or {}).get("check")
        if check is None:
            continue
        checked = True
        if not check.get("ok", True):
            failed.append(SHORT_NAMES.get(mode, mode))
    return ("FAILED: " + ", ".join(failed)) if failed else ("ok" if checked else "-")


def load_warning(report: dict) -> Optional[str]:
    """A warning when the load sampled before or after the run shows other work on the machine
    (:func:`bench.timing.load_is_high`), else None."""
    from bench.timing import load_is_high  # noqa: PLC0415

    load, cores = report.get("load") or {}, report["machine"].get("cores") or 1
    high = []
    if load.get("start") and load_is_high(load["start"], cores):
        high.append("before")
    if load.get("end") and load_is_high(load["end"], cores, use_load_average=False):
        high.append("after")
    if not high:
        return None
    return (f"WARNING: the machine was busy with other work {' and '.join(high)} the run "
            f"(load sampled {_load_text(load)}; {cores} cores): every figure here is disturbed "
            "by it, efficiencies vs 1 rank most. Rerun on an idle machine before quoting them.")


def idle_seconds(report: dict) -> Optional[float]:
    """About how long the run's jobs would take on an idle machine with a core per rank: each
    job's CPU seconds over its rank count, summed (the allreduce benchmark's over its largest
    rank count); None where the CPU time was not recorded."""
    total, seen = 0.0, False
    for model in report["models"].values():
        for key, job in model.get("jobs", {}).items():
            if job.get("cpu_seconds") is not None:
                total += job["cpu_seconds"] / max(1, int(key.split("/")[0]))
                seen = True
    if report.get("allreduce_cpu_seconds") is not None:
        total += report["allreduce_cpu_seconds"] / max([int(r) for r in report.get("ranks", [1])])
        seen = True
    return total if seen else None


def _idle_text(report: dict) -> str:
    idle = idle_seconds(report)
    return "" if idle is None else (f" (its jobs used {idle:.0f} CPU s per rank: about that "
                                    "long on an idle machine with a core per rank)")


def _load_text(load: dict) -> str:
    parts = []
    for when in ("start", "end"):
        snap = load.get(when)
        if snap:
            busy = snap.get("busy_fraction")
            parts.append(f"at {when}: load average {snap.get('load_average')}, "
                         f"{'?' if busy is None else f'{busy:.0%}'} of the cores busy")
    return "; ".join(parts) or "not recorded"


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
    """A few lines for the terminal: the summary table, cores per rank, the load warning and
    Horovod's status."""
    rows = summary_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.append(_cores_line(report))
    warning = load_warning(report)
    if warning:
        lines.append(warning)
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


PROTOCOL = (
    "Protocol: weak scaling (fixed per-rank batch). In each job the variants are warmed up "
    "until their step times settle (the median of the last 3 steps within 5% of the 3 before, "
    "at most 40 steps), then take turns over repeated rounds (the order rotated every round), "
    "a few steps each per round; a step's time is the slowest rank's, a round's figure the "
    "median of its steps, and every figure below the median over rounds with the rounds' "
    "[min-max], printed to the precision that spread allows. **hpcrep/no-sync** is hpcrep's "
    "throughput over the unsynchronised step of the same job, round by round: other work on the "
    "machine slows both alike, so it is the honest figure; peers timed in jobs of their own "
    "(Horovod, MWMS) are compared through their own job's no-sync. Efficiency vs 1 rank = "
    "throughput(n) / (n x throughput(1)) of the same variant at the same cores per rank, across "
    "jobs run minutes apart: machine contention moves it (no-sync itself shows how much). Every "
    "variant is self-checked (see 'Self-checks'); one that fails is marked and not timed.")


def markdown(report: dict, images: list[str]) -> str:
    """The Markdown text of a report."""
    m, v = report["machine"], report["versions"]
    rows = summary_rows(report)
    warning = load_warning(report)
    load_avg = m.get("load_average")
    lines = [f"# hpcrep scaling benchmark ({report['created']})", "",
             f"Machine: {m.get('host')}, {m.get('cores')} cores ({m.get('cpu')}), "
             f"{m.get('memory_gib')} GiB. Load sampled while nothing of the benchmark ran: "
             f"{_load_text(report.get('load') or {'start': {'load_average': load_avg}})}"
             " (the 1-minute average at the end still counts the benchmark's own ranks).",
             *([f"**{warning}**"] if warning else []),
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
             _cores_line(report),
             f"Mode: {'quick' if report.get('quick') else 'full'}. {PROTOCOL} "
             f"Took {report.get('seconds', 0):.0f} s{_idle_text(report)}.", "",
             "## Summary", "", "| " + " | ".join(rows[0]) + " |",
             "|---|" + "---:|" * (len(rows[0]) - 2) + "---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]] + [""]
    lines += _peers_md(report)
    for name, model in report["models"].items():
        lines += _model_md(name, model)
    lines += _checks_md(report)
    lines += _horovod_md(report)
    lines += _allreduce_md(report.get("allreduce") or {})
    lines += _projection_md(report["projection"])
    lines += _checked_md(report)
    if report.get("errors"):
        lines += ["## Failed jobs", ""] + [f"```\n{e}\n```" for e in report["errors"]] + [""]
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images] + [""]
    return "\n".join(lines)


def _peers_md(report: dict) -> list[str]:
    """What each variant ran, exactly."""
    mwms = next((m.get("mwms") for m in report["models"].values() if m.get("mwms")), None)
    hv_env = next((m.get("horovod") for m in report["models"].values() if m.get("horovod")),
                  None)
    lines = ["## What each variant ran", "",
             "- **hpcrep**: the job's step with `hpcrep.tensorflow.DistributedGradientTape` "
             "(ResNet-50, D4PG) or the Replicator's `wrap_optimizer` (SN-GAN): MPI (Open MPI, "
             "shared memory between ranks on one node), gradients fused into buffers of "
             f"{report.get('fusion_threshold', 16 << 20) / 2 ** 20:.0f} MiB.",
             "- **no-sync**: the same step with the plain tape and optimizer: no exchange (the "
             "upper bound).",
             "- **raw MPI**: the same step with the gradients averaged by hand-written mpi4py "
             "inside the compiled step (one `tf.numpy_function`): one flat float32 buffer "
             "allocated once and reused, each tensor's slot 64-byte aligned, the gradients "
             "copied in already scaled by 1/n, one in-place `MPI_Allreduce`, aligned views "
             "handed back to the graph (`bench/sync.py`)."]
    if hv_env:
        lines.append(
            "- **Horovod**: the same step, in an MPI job of its own under `.venv-peers` with its "
            "own no-sync: `horovod.tensorflow.DistributedGradientTape` (ResNet-50, D4PG; Keras 3 "
            "variables passed as their `tf.Variable`) or, for SN-GAN's optimizers, "
            "`horovod.tensorflow.grouped_allreduce(op=Average)` in the optimizer's `apply`; "
            + ", ".join(f"{k}={val}" for k, val in hv_env.items()) + " (fusion buffer as "
            "large as hpcrep's, 1 ms cycle).")
    if mwms:
        lines.append(
            "- **MWMS** (ResNet-50 only): `tf.distribute.MultiWorkerMirroredStrategy`, one worker "
            "per rank, in a job of its own with its own no-sync (the same model outside the "
            "strategy), `CommunicationOptions(bytes_per_pack="
            f"{mwms.get('bytes_per_pack', 0) / 2 ** 20:.0f} MiB)`, collective implementation "
            f"{mwms.get('implementation')}: TensorFlow's collective ops over "
            f"{mwms.get('transport')}, against hpcrep's MPI over shared memory. It is a "
            "comparison of stacks, not of allreduce algorithms.")
    lines.append("- Batch norm: each replica's own statistics in every variant (SN-GAN's "
                 "cross-replica batch norm is off in the benchmark, so the variants differ only "
                 "in how they average gradients).")
    return lines + [""]


def _model_md(name: str, model: dict) -> list[str]:
    lines = [f"## {name}", "", f"Throughput in {model.get('unit', '?')}; gradients: "
             f"{model.get('grad_tensors', '?')} tensors, "
             f"{(model.get('grad_bytes') or 0) / 1e6:.2f} MB per exchange, "
             f"{model.get('syncs_per_step', 1)} exchange(s) per step. Figures: median "
             "[min-max] over rounds.", "",
             "| variant | job | ranks | threads per rank | throughput | step ms | throughput / "
             "its job's no-sync | efficiency vs 1 rank | self-check |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for mode, runs in model.get("runs", {}).items():
        job = "own" if mode in OWN_JOB_PEERS else "main"
        for n, r in sorted(runs.items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"| {PEER_NAMES.get(mode, mode)} | {job} | {n} | "
                f"{_fmt(r.get('threads_per_rank'), 'd')} | "
                f"{_run_spread(r, 'throughput')} | {_run_spread(r, 'step_ms')} | "
                f"{fmt_figure(r.get('vs_nosync'))} | {_fmt(r.get('efficiency'), '.2f')} | "
                f"{_check_text(r.get('check'))} |")
    for peer, by_n in model.get("peer_jobs", {}).items():
        for n, own in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            r = own.get("nosync") or {}
            lines.append(
                f"| no-sync of the {SHORT_NAMES.get(peer, peer)} job | own | {n} | "
                f"{_fmt(r.get('threads_per_rank'), 'd')} | "
                f"{_run_spread(r, 'throughput')} | {_run_spread(r, 'step_ms')} | "
                "1 | - | - |")
    if model.get("ratios"):
        lines += ["", "hpcrep throughput / peer throughput (median [min-max]):", ""]
        for peer, ratios in model["ratios"].items():
            via = " (each against its own job's no-sync)" if peer in OWN_JOB_PEERS else ""
            lines.append(f"- {PEER_NAMES.get(peer, peer)}{via}: " + ", ".join(
                f"{n} ranks {fmt_figure(val)}x" for n, val in ratios.items()))
    return lines + [""]


def _run_spread(run: dict, key: str) -> str:
    """:func:`fmt_spread` of ``run[key]`` with ``run[key + "_min"]`` and ``_max``."""
    return fmt_spread(run.get(key), run.get(f"{key}_min"), run.get(f"{key}_max"))


def _check_text(check: Optional[dict]) -> str:
    if not check:
        return "-"
    if not check.get("ok", True):
        bad = [c.get("detail", k) for k, c in check.items() if isinstance(c, dict)
               and not c.get("ok", True)]
        return "**FAILED**: " + "; ".join(bad)
    grad = check.get("gradient") or {}
    if grad and "not averaged" in grad.get("detail", ""):
        return "ok (not averaged, as expected)"
    return "ok" if (grad or check.get("weights")) else check.get("note", "ok")


def _checks_md(report: dict) -> list[str]:
    lines = ["## Self-checks", "",
             "After its timing each variant restarts from rank 0's weights and optimizer state, "
             "runs one step, and the SHA-256 digests of every rank's trainable weights are "
             "compared: equal for a variant that averages, different for no-sync (which shows "
             "the check can fail). Before its timing each variant averages a probe gradient "
             "(loss sum(v * c_rank) with a different random c_rank per rank, so the averaged "
             "gradient is exactly the mean of the c_rank) through the same tape or optimizer "
             "wrapper; it must match the float64 mean within (n + 2) 2^-24 sum|c| / n per "
             "element (the float32 rounding of n - 1 additions and one scaling by 1/n) and "
             "hpcrep's own within twice that. 'worst' is the largest error over that bound.", "",
             "| model | ranks | variant | weights | gradient (worst / bound) |",
             "|---|---:|---|---|---|"]
    for name, model in report["models"].items():
        for mode, by_n in model.get("runs", {}).items():
            for n, r in sorted(by_n.items(), key=lambda kv: int(kv[0])):
                check = r.get("check") or {}
                w, g = check.get("weights") or {}, check.get("gradient") or {}
                lines.append(
                    f"| {name} | {n} | {PEER_NAMES.get(mode, mode)} | "
                    f"{('ok: ' if w.get('ok') else 'FAILED: ') + w['detail'] if w else '-'} | "
                    + (f"{'ok' if g.get('ok') else 'FAILED'}: {g.get('detail')} "
                       f"({g.get('worst_over_tolerance', 0):.2g})" if g else "-") + " |")
    return lines + [""]


def _horovod_md(report: dict) -> list[str]:
    hv = report["peers"].get("horovod", {})
    lines = ["## Horovod", ""]
    if hv.get("status") != "importable":
        return lines + [f"Status: {hv.get('status')}"
                        + (f" ({hv['error']})" if hv.get("error") else "")
                        + f". To build it: {hv.get('how_to_build', 'make peers')}.", ""]
    lines += [f"Horovod {hv.get('version')} ({hv.get('python')}), built from its sdist by "
              "`make peers`, timed in an MPI job of its own per rank count (once "
              "`horovod.init()` has run, its background thread slows every step in the process, "
              "the unsynchronised one included), against that job's own no-sync. The ratio is "
              "(hpcrep / its no-sync) over (Horovod / its no-sync).", "",
              "| model | ranks | hpcrep / no-sync | Horovod / its no-sync | hpcrep/Horovod |",
              "|---|---:|---:|---:|---:|"]
    for name, model in report["models"].items():
        theirs = model.get("runs", {}).get("horovod", {})
        ours = model.get("runs", {}).get("hpcrep", {})
        for n in sorted(theirs, key=int):
            ratio = model.get("ratios", {}).get("horovod", {}).get(n)
            lines.append(f"| {name} | {n} | {fmt_figure(ours.get(n, {}).get('vs_nosync'))} | "
                         f"{fmt_figure(theirs[n].get('vs_nosync'))} | {fmt_figure(ratio)} |")
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


def _checked_md(report: dict) -> list[str]:
    """The projection's model at the measured points, beside the measurements."""
    checked = (report.get("projection") or {}).get("checked") or {}
    lines = ["## The model against this run's measurements", ""]
    if "omitted" in checked or not checked.get("models"):
        return lines + [f"Omitted: {checked.get('omitted', 'nothing to check')}.", ""]
    net = checked["network"]
    lines += ["The projection is a model, not a measurement. Here it is evaluated, with the "
              "same formula and parameters, at the rank counts this run measured, on the "
              f"network they ran on ({net['name']}: {net['bandwidth_gbps']:.2f} GB/s, "
              f"{net['latency_us']:g} us per message, stated), beside what was measured: "
              "hpcrep's efficiency vs 1 rank and hpcrep/no-sync at the same rank count (the "
              "model's efficiency is the 1-rank compute over compute plus exchange, so "
              "hpcrep/no-sync is what it should match when the ranks have a core each; where "
              "the two disagree, trust neither projection row beyond what the measurements "
              "support).", "",
              "| model | ranks | model | measured efficiency vs 1 rank | measured hpcrep/no-sync |",
              "|---|---:|---:|---:|---:|"]
    for name, points in checked["models"].items():
        model = report["models"].get(name, {})
        for n, value in points.items():
            eff = model.get("runs", {}).get("hpcrep", {}).get(n, {}).get("efficiency")
            lines.append(f"| {name} | {n} | {value:.2f} | {_fmt(eff, '.2f')} | "
                         f"{fmt_figure(model.get('ratios', {}).get('nosync', {}).get(n))} |")
    return lines + [""]
