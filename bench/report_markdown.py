"""``report.md`` and the PNG plots of a benchmark report (after :func:`bench.report.derive`).

:func:`render` writes both; :func:`markdown` is the text, one section per helper.
"""

from __future__ import annotations

import os
from typing import Optional

from bench import memory, plots
from bench.modes import AUTOTUNE, powersgd_rank
from bench.plots import peer_name
from bench.report import (OWN_JOB_PEERS, SHORT_NAMES, cores_line, fmt, fmt_figure, fmt_spread,
                          idle_text, load_text, load_warning, pooling_line, summary_rows)


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
    "median of its steps. Every job runs several times (--repeats; the repeats interleaved: "
    "every variant's and rank count's first job, then every second job), because rounds inside "
    "one job share its placement, memory layout and warm-up and cannot show how much a second "
    "job differs; every figure below is the median over all rounds of all its jobs with their "
    "[min-max], printed to the precision that spread allows, and a ratio is formed only round "
    "by round between variants timed in the same round of the same job. **hpcrep/no-sync** is "
    "hpcrep's throughput over the unsynchronised step of the same job, round by round: other "
    "work on the machine slows both alike, so it is the honest figure; peers timed in jobs of "
    "their own "
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
             f"{load_text(report.get('load') or {'start': {'load_average': load_avg}})}"
             " (the 1-minute average at the end still counts the benchmark's own ranks).",
             *([f"**{warning}**"] if warning else []),
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
             cores_line(report),
             f"Mode: {'quick' if report.get('quick') else 'full'}. {PROTOCOL} "
             f"Took {report.get('seconds', 0):.0f} s{idle_text(report)}.", "",
             "## Summary", "", "| " + " | ".join(rows[0]) + " |",
             "|---|" + "---:|" * (len(rows[0]) - 2) + "---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]] + [""]
    pooling = pooling_line(report)
    lines += [pooling, ""] if pooling else []
    lines += _drift_md(report)
    lines += _peers_md(report)
    for name, model in report["models"].items():
        lines += _model_md(name, model)
    lines += _checks_md(report)
    lines += _horovod_md(report)
    lines += _allreduce_md(report.get("allreduce") or {})
    lines += memory.markdown(report.get("memory"))
    lines += _projection_md(report["projection"])
    lines += _checked_md(report)
    if report.get("errors"):
        lines += ["## Failed jobs", ""] + [f"```\n{e}\n```" for e in report["errors"]] + [""]
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images] + [""]
    return "\n".join(lines)


def _drift_md(report: dict) -> list[str]:
    """Each summary ratio beside its per-job medians, in the order the jobs ran: how far one
    job's figure lies from another's on this machine."""
    from bench.report import SUMMARY_PEERS  # noqa: PLC0415

    rows = []
    for name, model in report["models"].items():
        ratios = model.get("ratios", {})
        ranks = sorted({n for by_n in ratios.values() for n in by_n}, key=int)
        for n, peer in ((n, p) for n in ranks for p in SUMMARY_PEERS):
            value = ratios.get(peer, {}).get(n)
            jobs = value.get("jobs") if isinstance(value, dict) else None
            if jobs:
                rows.append(f"| {name} | {n} | hpcrep/{SHORT_NAMES[peer]} | {fmt_figure(value)} "
                            f"| {', '.join(f'{j:.2f}' for j in jobs)} | "
                            f"{max(jobs) - min(jobs):.2f} |")
    if not rows:
        return []
    return ["## Job-to-job drift", "",
            "Each summary ratio pooled over its jobs, beside each job's own median (in the "
            "order the jobs ran) and the gap between the highest and lowest of them. A second "
            "run's figure is a median of such jobs again.", "",
            "| model | ranks | ratio | pooled median [min-max] | per-job medians | gap |",
            "|---|---:|---|---:|---|---:|", *rows, ""]


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
    modes = {mode for m in report["models"].values() for mode in m.get("runs", {})}
    for rank in sorted({r for r in map(powersgd_rank, modes) if r is not None}):
        lines.append(
            f"- **{peer_name(f'hpcrep_powersgd{rank}')}** (`--variants`): hpcrep's step with "
            f"`compression=hvd.Compression.powersgd(rank={rank})` (no warm-up): matrices sent "
            f"as two fused allreduces of rank-{rank} factors with error feedback, vectors "
            "uncompressed; one PowerSGD object per set of variables, kept from step to step. "
            "It does not compute the exact average, so its gradient check uses a probe whose "
            f"mean has rank {rank} (see 'Self-checks').")
    if AUTOTUNE in modes:
        lines.append(
            f"- **{peer_name(AUTOTUNE)}** (`--variants`): hpcrep's step traced with "
            "`HPCREP_AUTOTUNE=1`: before the timed rounds each job trains it alone until the "
            "tuner settles (fusion threshold and piece size), then freezes it, so the timing "
            "is of the settled setting (stated under each model).")
    lines.append("- Batch norm: each replica's own statistics in every variant (SN-GAN's "
                 "cross-replica batch norm is off in the benchmark, so the variants differ only "
                 "in how they average gradients).")
    return lines + [""]


def _trace_text(trace: Optional[dict]) -> str:
    """The two timeline columns of a run: exposed communication per step (median [min-max] over
    jobs) and the overlap fraction (median over jobs); "-" where the run was not traced."""
    if not trace or trace.get("exposed_ms") is None:
        return "- | -"
    exposed = fmt(trace["exposed_ms"], ".1f")
    if trace.get("jobs", 1) > 1 and trace.get("exposed_ms_min") is not None:
        exposed += f" [{trace['exposed_ms_min']:.1f}-{trace['exposed_ms_max']:.1f}]"
    return f"{exposed} | {fmt(trace.get('overlap'), '.2f')}"


def _model_md(name: str, model: dict) -> list[str]:
    lines = [f"## {name}", "", f"Throughput in {model.get('unit', '?')}; gradients: "
             f"{model.get('grad_tensors', '?')} tensors, "
             f"{(model.get('grad_bytes') or 0) / 1e6:.2f} MB per exchange, "
             f"{model.get('syncs_per_step', 1)} exchange(s) per step. Figures: median "
             "[min-max] over all rounds of all jobs; 'per-job step ms' is each job's median, in "
             "the order the jobs ran. 'exposed comm ms (timeline)' and 'overlap' come from a "
             "timeline of a few more steps of hpcrep's variant in each job (bench/exposed.py; "
             "the traces are jobs/*.trace.json, for hpcrep analyze): the time a step waited on "
             "collectives after asking for its last one, and the share of its MPI time that ran "
             "before that, hidden behind compute.", "",
             "| variant | job | ranks | threads per rank | jobs x rounds | throughput | step ms "
             "| per-job step ms | throughput / its job's no-sync | efficiency vs 1 rank | "
             "exposed comm ms (timeline) | overlap | self-check |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for mode, runs in model.get("runs", {}).items():
        job = "own" if mode in OWN_JOB_PEERS else "main"
        for n, r in sorted(runs.items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"| {peer_name(mode)} | {job} | {n} | "
                f"{fmt(r.get('threads_per_rank'), 'd')} | {_pooled_text(r)} | "
                f"{_run_spread(r, 'throughput')} | {_run_spread(r, 'step_ms')} | "
                f"{_job_medians_text(r)} | "
                f"{fmt_figure(r.get('vs_nosync'))} | {fmt(r.get('efficiency'), '.2f')} | "
                f"{_trace_text(r.get('trace'))} | {_check_text(r.get('check'))} |")
    for peer, by_n in model.get("peer_jobs", {}).items():
        for n, own in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            r = own.get("nosync") or {}
            lines.append(
                f"| no-sync of the {SHORT_NAMES.get(peer, peer)} job | own | {n} | "
                f"{fmt(r.get('threads_per_rank'), 'd')} | {_pooled_text(r)} | "
                f"{_run_spread(r, 'throughput')} | {_run_spread(r, 'step_ms')} | "
                f"{_job_medians_text(r)} | 1 | - | - | - | - |")
    tuned = [autotune_text(n, r.get("autotune")) for n, r in sorted(
        model.get("runs", {}).get(AUTOTUNE, {}).items(), key=lambda kv: int(kv[0]))]
    if tuned:
        lines += ["", f"{peer_name(AUTOTUNE)}, before the timing: " + " ".join(tuned)]
    if model.get("ratios"):
        lines += ["", "hpcrep throughput / peer throughput (median [min-max]):", ""]
        for peer, ratios in model["ratios"].items():
            via = " (each against its own job's no-sync)" if peer in OWN_JOB_PEERS else ""
            lines.append(f"- {peer_name(peer)}{via}: " + ", ".join(
                f"{n} ranks {fmt_figure(val)}x" for n, val in ratios.items()))
    return lines + [""]


def autotune_text(n: str, settlements: Optional[list]) -> str:
    """One sentence: how each job's tuner settled for ``hpcrep_autotune`` at ``n`` ranks (job
    order), from the settlements :func:`bench.overlap.settle_autotune` returned (``settled``
    None: no tuner ran)."""
    from hpcrep.comm.autotune import Setting  # noqa: PLC0415

    if not settlements:
        return f"{n} ranks: not recorded."
    parts = []
    for i, t in enumerate(settlements, start=1):
        job = f"job {i}: " if len(settlements) > 1 else ""
        if not t or t.get("settled") is None:
            parts.append(job + ((t or {}).get("detail") or "no tuner ran"))
            continue
        setting = Setting(t["threshold"], t["chunk"], t.get("fp16", False))
        state = "settled" if t["settled"] else "had not settled, frozen"
        parts.append(f"{job}{state} after {t['steps']} steps ({t['seconds']:.0f} s, "
                     f"{len(t.get('trials') or [])} settings timed) on {setting}")
    return f"{n} ranks: " + "; ".join(parts) + "."


def _pooled_text(run: dict) -> str:
    """``jobs x rounds per job`` of a run ('2 x 3'; '1 x 5' for a report from before repeats;
    ``3+2`` rounds where the jobs differ)."""
    per_job = run.get("job_rounds") or ([run["rounds"]] if run.get("rounds") else [])
    if not per_job:
        return "-"
    if len(set(per_job)) == 1:
        return f"{len(per_job)} x {per_job[0]}"
    return f"{len(per_job)} x ({'+'.join(str(k) for k in per_job)})"


def _job_medians_text(run: dict) -> str:
    """Each job's median step time, in the order the jobs ran ('-' where not recorded)."""
    medians = run.get("job_step_ms")
    if not medians:
        return "-"
    return ", ".join(format(m, ".3g") for m in medians)


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
             "hpcrep's own within twice that. 'worst' is the largest error over that bound."
             + (" PowerSGD (hpcrep PowerSGD rank R) averages exactly only gradients whose mean "
                "has rank R or less: its probe is, for each matrix it compresses, c_rank = "
                "U_rank V^T (U_rank random per rank, V shared: PowerSGD's starting Q, scaled), "
                "whose mean has rank R, and its bound adds 8 u kappa ||mean||_F per element "
                "(kappa = ||mean||_2 / sigma_R(mean Q): PowerSGD's QR and matmul rounding, "
                "bench/selfcheck.py); vectors keep the float32 bound. no-sync takes that probe "
                "too and must fail it." if any(
                    powersgd_rank(mode) is not None for m in report["models"].values()
                    for mode in m.get("runs", {})) else ""), "",
             "| model | ranks | variant | weights | gradient (worst / bound) |",
             "|---|---:|---|---|---|"]
    for name, model in report["models"].items():
        for mode, by_n in model.get("runs", {}).items():
            for n, r in sorted(by_n.items(), key=lambda kv: int(kv[0])):
                check = r.get("check") or {}
                w, g = check.get("weights") or {}, check.get("gradient") or {}
                gradient = [_verdict_text(g)] if g else []
                gradient += [f"PowerSGD rank {key[len('powersgd'):-len('_probe')]}'s probe: "
                             + _verdict_text(c) for key, c in check.items()
                             if key.startswith("powersgd") and key.endswith("_probe")]
                lines.append(
                    f"| {name} | {n} | {peer_name(mode)} | "
                    f"{('ok: ' if w.get('ok') else 'FAILED: ') + w['detail'] if w else '-'} | "
                    + ("; ".join(gradient) or "-") + " |")
    return lines + [""]


def _verdict_text(check: dict) -> str:
    """A gradient verdict as the self-checks table shows it: outcome, detail, worst / bound."""
    return (f"{'ok' if check.get('ok') else 'FAILED'}: {check.get('detail')} "
            f"({check.get('worst_over_tolerance', 0):.2g})")


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
                 "measured as hidden behind compute: the overlap fraction of hpcrep's timeline at "
                 + ", ".join(f"{m['overlap_measured_at']} ranks for {name}"
                             for name, m in proj["models"].items()
                             if m.get("overlap_measured_at")) + "." if overlap else
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
            lines.append(f"| {name} | {n} | {value:.2f} | {fmt(eff, '.2f')} | "
                         f"{fmt_figure(model.get('ratios', {}).get('nosync', {}).get(n))} |")
    return lines + [""]
