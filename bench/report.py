"""Turn benchmark results (``report.json``) into derived figures and the terminal summary.

:func:`derive` adds efficiencies, hpcrep-vs-peer ratios and the projection to a report dict;
:func:`summary` gives the terminal's few lines. :func:`bench.report_markdown.render` writes
``report.md`` and the plots; ``hpcrep report DIR`` calls both again.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from bench.placement import oversubscribed
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
    for model in report["models"].values():
        if model.pop("overlap_measured_at", None) is not None:  # an earlier derive() set it
            model.pop("overlap_fraction", None)
        measured = measured_overlap(model)
        if measured is not None and model.get("overlap_fraction") is None:
            model["overlap_fraction"], model["overlap_measured_at"] = measured
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
                if model.get("overlap_measured_at"):
                    inputs[name]["overlap_measured_at"] = model["overlap_measured_at"]
    report["projection"] = project(inputs, software, memcpy, report["fusion_threshold"])
    measured = sorted({int(n) for m in report["models"].values()
                       for by_n in m.get("runs", {}).values() for n in by_n})
    report["projection"]["checked"] = check_points(
        inputs, software, memcpy, report["fusion_threshold"], measured, report.get("cluster"))


def measured_overlap(model: dict) -> Optional[tuple[float, int]]:
    """The overlap fraction hpcrep's timeline measured for ``model`` (:mod:`bench.exposed`), at
    the largest rank count whose trace has MPI time, with that rank count; None without one,
    and None for a model that exchanges more than once per step: the analysis counts only the
    step's last exchange as waited on (its compute end is the last request), so an earlier
    exchange the step waited for (SN-GAN's discriminator update) would count as hidden."""
    if model.get("syncs_per_step", 1) != 1:
        return None
    hpcrep_runs = model.get("runs", {}).get("hpcrep", {})
    for n in sorted(hpcrep_runs, key=int, reverse=True):
        overlap = (hpcrep_runs[n].get("trace") or {}).get("overlap")
        if overlap is not None:
            return float(overlap), int(n)
    return None


def peer_ratio(model: dict, peer: str, n: str) -> Optional[dict]:
    """hpcrep's throughput over ``peer``'s at ``n`` ranks, ``{"median", "min", "max"}``, or None
    where either has no figure (not run, or failed its self-check).

    - ``nosync``: hpcrep's ``vs_nosync`` (per-round ratio in the same job);
    - a peer in hpcrep's job (raw MPI): the per-round ratio of their step times;
    - a peer in a job of its own (Horovod, MWMS): hpcrep over its job's nosync, divided by the
      peer over its own job's nosync (:func:`ratio_of`), so that each is measured against the
      unsynchronised step of its own process and minute.

    Over repeated jobs (:mod:`bench.pooling`) the figure pools every round of every job and
    carries ``jobs``: each job's median ratio (for a peer in a job of its own, job ``i`` of
    hpcrep's over job ``i`` of the peer's, which ran in the same repeat).

    Reports without per-round times fall back to the throughput ratio (no spread).
    """
    from bench.pooling import pooled_ratio  # noqa: PLC0415

    ours = model.get("runs", {}).get("hpcrep", {}).get(n) or {}
    theirs = model.get("runs", {}).get(peer, {}).get(n) or {}
    if ours.get("throughput") is None or theirs.get("throughput") is None:
        return None
    if peer == "nosync" and ours.get("vs_nosync"):
        return dict(ours["vs_nosync"])
    if peer in OWN_JOB_PEERS:
        own = model.get("peer_jobs", {}).get(peer, {}).get(n, {}).get("nosync")
        if ours.get("vs_nosync") and theirs.get("vs_nosync") and own:
            out = ratio_of(ours["vs_nosync"], theirs["vs_nosync"])
            a, b = ours["vs_nosync"].get("jobs"), theirs["vs_nosync"].get("jobs")
            if a and b and len(a) == len(b):  # job i of each ran in the same repeat
                out["jobs"] = [x / y for x, y in zip(a, b)]
            return out
        paired = model.get("paired", {}).get(peer, {}).get(n)  # reports from before
        ours = paired or ours
    elif ours.get("round_ms") and theirs.get("round_ms") and \
            len(ours["round_ms"]) == len(theirs["round_ms"]):
        same_jobs = ours.get("job_rounds") and ours.get("job_rounds") == theirs.get("job_rounds")
        return pooled_ratio(theirs["round_ms"], ours["round_ms"],
                            ours["job_rounds"] if same_jobs else None)
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


def fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(report: dict) -> list[list[str]]:
    """The summary table: per model and rank count, hpcrep's throughput over no-sync's (the
    figure machine contention cancels out of) first, then over each peer's, then hpcrep's
    efficiency vs 1 rank, and the self-checks. Figures are medians with min-max over all rounds
    of all repeated jobs.
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
                        + [fmt(eff, ".2f"), _checks_cell(model, n)])
    return rows


def pooling_line(report: dict) -> str:
    """How many jobs and rounds the figures pool: one sentence, naming any run that pooled
    fewer (a failed or timed-out repeat); '' for a report without pooled runs."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, model in report["models"].items():
        groups = [(SHORT_NAMES.get(mode, mode), by_n) for mode, by_n in
                  model.get("runs", {}).items()]
        groups += [(f"no-sync of the {SHORT_NAMES.get(p, p)} job",
                    {n: own.get("nosync") or {} for n, own in by_n.items()})
                   for p, by_n in model.get("peer_jobs", {}).items()]
        for label, by_n in groups:
            for n, r in by_n.items():
                if r.get("jobs") is None:
                    continue
                shape = (int(r["jobs"]), int(r.get("rounds") or 0))
                shapes.setdefault(shape, []).append(f"{name} {n} ranks {label}")
    if not shapes:
        return ""
    common = max(shapes, key=lambda k: (len(shapes[k]), k))
    text = (f"Each figure pools {_jobs_rounds(*common)}: its median and [min-max] are over all "
            "their rounds (per-job medians under 'Job-to-job drift')")
    others = [f"{', '.join(where)}: {_jobs_rounds(*shape)}" for shape, where in
              sorted(shapes.items()) if shape != common]
    return text + ("; except " + "; ".join(others) if others else "") + "."


def _jobs_rounds(jobs: int, rounds: int) -> str:
    """'2 jobs x 3 rounds', or '2 jobs, 5 rounds in all' where the jobs had different rounds."""
    plural = "s" if jobs != 1 else ""
    if rounds % max(jobs, 1) == 0:
        return f"{jobs} job{plural} x {rounds // max(jobs, 1)} rounds"
    return f"{jobs} job{plural}, {rounds} rounds in all"


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
            f"(load sampled {load_text(load)}; {cores} cores): every figure here is disturbed "
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


def idle_text(report: dict) -> str:
    idle = idle_seconds(report)
    return "" if idle is None else (f" (its jobs used {idle:.0f} CPU s per rank: about that "
                                    "long on an idle machine with a core per rank)")


def load_text(load: dict) -> str:
    parts = []
    for when in ("start", "end"):
        snap = load.get(when)
        if snap:
            busy = snap.get("busy_fraction")
            parts.append(f"at {when}: load average {snap.get('load_average')}, "
                         f"{'?' if busy is None else f'{busy:.0%}'} of the cores busy")
    return "; ".join(parts) or "not recorded"


def cores_line(report: dict) -> str:
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
    pooling = pooling_line(report)
    if pooling:
        lines.append(pooling)
    lines.append(cores_line(report))
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
