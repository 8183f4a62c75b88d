"""``hpcrep bench MODEL --ranks 1,2,4``: weak-scaling benchmark with peers side by side.

For each model and rank count an MPI job (``python -m jobs.<package> --bench-json``, run from
the repository's top directory), run ``--repeats`` times and its rounds pooled
(``bench/pooling.py``), times the job's own training step with hpcrep's public API, with
no synchronisation (upper bound) and with a hand-written mpi4py allreduce (raw baseline) swapped
in underneath (``bench/variants.py``), interleaved over repeated rounds and self-checked
(``bench/job.py``); ResNet-50 also runs under ``tf.distribute.MultiWorkerMirroredStrategy`` on
localhost, in a job of its own with its own nosync. Horovod is timed in a job of its own too,
against its own nosync, under ``.venv-peers/bin/python``, when ``make peers`` has built it
(``bench/peers.py``); the report says how to build it otherwise. The machine's load is sampled
before and after. Every rank gets the same number of cores
(``--cores-per-rank``, ``bench/placement.py``) at every rank count, so efficiencies compare like
with like. ``--variants`` adds hpcrep variants to the same jobs (``bench/modes.py``: PowerSGD
of rank R, the autotuned exchange). The allreduce benchmark (``bench.allreduce``) runs in the
same invocation. Results, plots and a projection to 8..1024 ranks go to
``reports/<timestamp>/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time
from typing import Any, Optional

from bench.peers import horovod_status
from bench.progress import Progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("resnet50", "sngan", "d4pg")
JOBS = {"resnet50": "jobs.resnet", "sngan": "jobs.sngan", "d4pg": "jobs.d4pg"}  # python -m
MODES = ("hpcrep", "nosync", "mpi4py")

# Per-model job arguments: quick mode (make bench, minutes on 2 cores) and full mode. Every
# variant of a job is warmed up until its step times settle (bench.timing.warm_up), then runs
# --steps steps in each of --rounds rounds, the variants taking turns. Each job runs REPEATS
# times (--repeats), the repeats interleaved across variants and rank counts; a figure is the
# median over all rounds of all repeats with their min-max (bench.pooling): rounds of one job
# share its placement, memory layout and warm-up, so only repeated jobs show job-to-job drift.
SETTINGS: dict[str, dict[bool, list[str]]] = {
    "resnet50": {True: ["--image-size", "32", "--batch", "8", "--rounds", "6", "--steps", "3"],
                 False: ["--image-size", "64", "--batch", "32", "--rounds", "7", "--steps",
                         "5"]},
    "sngan": {True: ["--image-size", "16", "--g-ch", "32", "--d-ch", "32", "--batch", "16",
                     "--n-dis", "1", "--rounds", "6", "--steps", "3"],
              False: ["--image-size", "32", "--g-ch", "64", "--d-ch", "64", "--batch", "32",
                      "--n-dis", "5", "--rounds", "7", "--steps", "3"]},
    "d4pg": {True: ["--batch", "128", "--min-replay", "500", "--rounds", "6", "--steps", "20"],
             False: ["--batch", "256", "--min-replay", "2000", "--rounds", "7", "--steps",
                     "40"]},
}

# Jobs per (model, rank count, variant), by quick mode. A quick job's rounds are a small part of
# its cost (start-up, tracing, warm-up and self-checks are the rest), so make bench runs 2 jobs x 6
# rounds: with 2 x 3, two of twenty summary medians (hpcrep/raw MPI at 1 rank) fell just outside
# the previous run's 6-round range.
REPEATS = {True: 2, False: 3}

# Horovod's settings in its job: its fusion buffer as large as hpcrep's (HPCREP_FUSION_THRESHOLD,
# 16 MiB by default) and its background cycle at 1 ms, so that a step's gradients leave in a few
# fused allreduces without waiting out a long cycle.
HOROVOD_CYCLE_TIME_MS = "1"


def horovod_env() -> dict[str, str]:
    """The environment of the Horovod job: ``HOROVOD_FUSION_THRESHOLD`` = hpcrep's fusion
    threshold, ``HOROVOD_CYCLE_TIME`` = :data:`HOROVOD_CYCLE_TIME_MS`."""
    from hpcrep import config  # noqa: PLC0415

    return {"HOROVOD_FUSION_THRESHOLD": str(int(config.get("HPCREP_FUSION_THRESHOLD"))),
            "HOROVOD_CYCLE_TIME": HOROVOD_CYCLE_TIME_MS}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``hpcrep bench``."""
    parser.add_argument("model", choices=MODELS + ("all",), help="model to benchmark, or all")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps (make bench)")
    parser.add_argument("--out", help="report directory (default reports/<timestamp>)")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the allreduce benchmark")
    parser.add_argument("--no-mwms", action="store_true", help="skip MultiWorkerMirroredStrategy")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the sharded-model figures that `all` adds on local ranks "
                             "(tensor-parallel click model, ZeRO-1)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="jobs per model, rank count and variant, their rounds pooled "
                             f"(default {REPEATS[True]} with --quick, {REPEATS[False]} without)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per MPI job")
    parser.add_argument("--cluster-nodes", type=int, default=0,
                        help="run every job across this many nodes of the multi-node test "
                             "cluster (tests/cluster, root; ranks spread evenly)")
    parser.add_argument("--link", help="with --cluster-nodes: cap each node's link (1gbit, ...)")
    parser.add_argument("--variants", default="",
                        help="extra hpcrep variants timed in the same jobs as hpcrep, no-sync and "
                             "raw MPI, comma-separated: hpcrep_powersgdR (PowerSGD of rank R, "
                             "e.g. hpcrep_powersgd2), hpcrep_autotune (HPCREP_AUTOTUNE=1, "
                             "settled before the timing, then frozen); default none")
    parser.add_argument("--cores-per-rank", type=int, default=0,
                        help="TensorFlow threads per rank at every rank count (default: cores // "
                             "the largest rank count, at least 1)")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and write the report; returns 0, or 1 if any job failed."""
    if not args.cluster_nodes:
        return _main(args, None)
    if args.cluster_nodes < 1:
        raise SystemExit(f"--cluster-nodes needs a positive number, got {args.cluster_nodes}")
    from bench.cluster import cluster  # noqa: PLC0415

    with cluster(args.cluster_nodes, args.link) as nodes:
        return _main(args, nodes)


def _main(args: argparse.Namespace, nodes: Any) -> int:
    from bench import report as report_mod  # noqa: PLC0415
    from bench import report_markdown  # noqa: PLC0415

    ranks = sorted({int(r) for r in args.ranks.split(",") if r.strip()})
    if not ranks or min(ranks) < 1:
        raise SystemExit(f"--ranks needs positive integers, got {args.ranks!r}")
    if 1 not in ranks:
        ranks = [1] + ranks  # efficiency is measured against 1 rank
    if args.repeats is None:
        args.repeats = REPEATS[bool(args.quick)]
    if args.repeats < 1:
        raise SystemExit(f"--repeats needs a positive number, got {args.repeats}")
    from bench.modes import parse_variants  # noqa: PLC0415

    try:
        variants = parse_variants(getattr(args, "variants", "") or "")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    from bench.placement import default_cores_per_rank, thread_env  # noqa: PLC0415

    cores = machine()["cores"]
    args.cores_per_rank = args.cores_per_rank or default_cores_per_rank(cores, ranks)
    try:
        thread_env(args.cores_per_rank)  # checks the value before anything runs
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    out = args.out or os.path.join("reports", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    from bench.timing import load_snapshot  # noqa: PLC0415

    load_start = load_snapshot()
    start = time.time()
    report: dict[str, Any] = {"created": datetime.datetime.now().isoformat(timespec="seconds"),
                              "quick": bool(args.quick), "ranks": ranks,
                              "repeats": args.repeats, "variants": variants,
                              "machine": machine(), "versions": versions(), "models": {},
                              "cores_per_rank": args.cores_per_rank, "peers": {}, "errors": [],
                              "cluster": nodes.describe() if nodes is not None else None,
                              "load": {"start": load_start}}
    models = MODELS if args.model == "all" else (args.model,)
    report["peers"]["horovod"] = horovod = horovod_status(ROOT)
    if horovod["status"] != "importable":
        print(f"bench: Horovod {horovod['status']}: {horovod['how_to_build']}", flush=True)
    modes = MODES + tuple(variants)
    with_memory = not args.no_memory and nodes is None and args.model == "all"
    progress = Progress([job_kind(model, n, variant) for model in models
                         for _, (n, variant) in model_jobs(model, ranks, args, modes, nodes,
                                                           horovod.get("python"))]
                        + ([] if args.no_allreduce else ["allreduce"])
                        + (["memory"] if with_memory else []))
    print(f"bench: {progress.total} jobs to run", flush=True)
    for model in models:
        report["models"][model] = run_model(model, ranks, args, out, report["errors"], modes,
                                            nodes, horovod.get("python"), progress)
    if not args.no_allreduce:
        cpu_start, began, errors = _children_cpu_seconds(), time.time(), len(report["errors"])
        report["allreduce"] = run_allreduce([r for r in ranks if r > 1] or [2], out, args.quick,
                                            report["errors"], nodes)
        report["allreduce_cpu_seconds"] = _children_cpu_seconds() - cpu_start
        progress.finished("allreduce", time.time() - began, len(report["errors"]) == errors)
    if with_memory:
        from bench import memory  # noqa: PLC0415

        began, errors = time.time(), len(report["errors"])
        report["memory"] = memory.run(ranks, out, args.quick, report["errors"], args.timeout,
                                      args.cores_per_rank)
        progress.finished("memory", time.time() - began, len(report["errors"]) == errors)
    report["seconds"] = time.time() - start
    report["load"]["end"] = load_snapshot()
    report_mod.derive(report)
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    paths = report_markdown.render(report, out)
    print(report_mod.summary(report))
    print("wrote " + ", ".join([os.path.join(out, "report.json")] + paths))
    return 1 if report["errors"] else 0


def model_jobs(model: str, ranks: list[int], args: argparse.Namespace, modes: tuple,
               nodes: Any, horovod_python: Optional[str]) -> list[tuple[int, tuple[int, str]]]:
    """Return ``model``'s jobs in the order :func:`run_model` runs them: ``(repeat, (ranks,
    variant))`` pairs. Pure."""
    plan = [(n, variant) for n in ranks for variant in job_variants(model, modes, args, nodes,
                                                                      horovod_python)]
    return job_order(plan, getattr(args, "repeats", None) or 1)


def run_model(model: str, ranks: list[int], args: argparse.Namespace, out: str,
              errors: list, modes: tuple = MODES, nodes: Any = None,
              horovod_python: Optional[str] = None, progress: Optional[Progress] = None) -> dict:
    """Run ``model``'s benchmark jobs at each rank count, each ``args.repeats`` times, and pool
    the repeats (:func:`bench.pooling.pool_jobs`); return {unit, runs: mode -> ranks -> r,
    peer_jobs: peer -> ranks -> {nosync: r}, jobs: "n/variant" -> its jobs' times}.

    The repeats are interleaved: every job of the first repeat (all rank counts, all variants),
    then every job of the second, and so on, so that a slow spell of the machine falls on some
    job of every variant rather than on all of one. ``nodes`` (a :class:`bench.cluster.Cluster`)
    runs the jobs across its nodes. MWMS (ResNet-50, local ranks only) and, with
    ``horovod_python``, Horovod run in jobs of their own, each with its own nosync
    (``peer_jobs``), which the report compares them against.
    """
    from bench.pooling import pool_jobs  # noqa: PLC0415

    repeats = getattr(args, "repeats", None) or 1
    jobs = model_jobs(model, ranks, args, modes, nodes, horovod_python)
    done: dict[tuple[int, str], list[dict]] = {key: [] for _, key in jobs}
    for repeat, (n, variant) in jobs:
        began = time.time()
        name = f"{model}-{n}-{variant.split(',')[0]}"
        path = os.path.join(out, "jobs", f"{name}-{repeat}.json" if repeats > 1
                            else f"{name}.json")
        extra = ["--port-base", str(free_port_base(n))] if variant == "mwms" else []
        job_modes = "horovod,nosync" if variant == "horovod" else variant
        data = run_job(model, n, ["--modes", job_modes, "--bench-json", path]
                       + SETTINGS[model][args.quick] + extra, args.timeout, errors, nodes,
                       horovod_python if variant == "horovod" else sys.executable,
                       args.cores_per_rank,
                       horovod_env() if variant == "horovod" else None,
                       f"job {repeat} of {repeats}" if repeats > 1 else "")
        if data is not None:
            done[(n, variant)].append(data)
        if progress is not None:
            progress.finished(job_kind(model, n, variant), time.time() - began,
                              data is not None)
    result: dict[str, Any] = {"runs": {}, "jobs": {}, "peer_jobs": {}, "repeats": repeats}
    for (n, variant), datas in done.items():
        if not datas:
            continue
        data = datas[-1]
        result["unit"] = data["unit"]
        for key in ("grad_bytes", "grad_tensors", "syncs_per_step", "batch_norm"):
            if key in data:
                result[key] = data[key]
        result["jobs"][f"{n}/{variant}"] = {
            "environment": data["environment"], "jobs": len(datas),
            "seconds": sum(d["seconds"] for d in datas),
            "cpu_seconds": sum(d["cpu_seconds"] for d in datas),
            "job_seconds": [d["seconds"] for d in datas],
            "job_cpu_seconds": [d["cpu_seconds"] for d in datas]}
        if variant == "mwms":
            result["mwms"] = data.get("mwms")
        if variant == "horovod":
            result["horovod"] = horovod_env()
        for mode, timing in pool_jobs([d["runs"] for d in datas]).items():
            own = variant in ("mwms", "horovod") and mode == "nosync"
            target = result["peer_jobs"].setdefault(variant, {}).setdefault(str(n), {}) \
                if own else result["runs"].setdefault(mode, {})
            target["nosync" if own else str(n)] = timing
    return result


def job_kind(model: str, n: int, variant: str) -> str:
    """What makes two benchmark jobs alike in length, for :class:`bench.progress.Progress`."""
    return f"{model} x{n} {variant}"


def job_order(plan: list, repeats: int) -> list[tuple[int, Any]]:
    """The order to run ``repeats`` jobs of each entry of ``plan``: ``(repeat, entry)`` pairs,
    every entry's first job (in ``plan``'s order), then every entry's second, and so on, so that
    a slow spell of the machine falls on one job of many entries, not on all jobs of one."""
    if repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats}")
    return [(repeat, entry) for repeat in range(1, repeats + 1) for entry in plan]


def job_variants(model: str, modes: tuple, args: argparse.Namespace, nodes: Any,
                 horovod_python: Optional[str]) -> list[str]:
    """The jobs ``model`` runs at each rank count: hpcrep's job with ``modes``, MWMS's (ResNet-50
    on local ranks, unless ``args.no_mwms``) and Horovod's (with ``horovod_python``)."""
    variants = [",".join(modes)]
    # MultiWorkerMirroredStrategy is wired to localhost ports: local ranks only.
    if model == "resnet50" and not args.no_mwms and nodes is None:
        variants.append("mwms")
    if horovod_python:
        variants.append("horovod")
    return variants


def run_job(model: str, n: int, job_args: list[str], timeout: int,
            errors: list, nodes: Any = None, python: str = sys.executable,
            cores_per_rank: int = 0, extra_env: Optional[dict] = None,
            which: str = "") -> Optional[dict]:
    """Run ``python -m jobs.<package>`` on ``n`` ranks (across ``nodes`` if given) under
    ``python``, from the repository's top directory, each rank with ``cores_per_rank`` threads
    (0: hpcrep's default) and ``extra_env`` set; return its JSON, or None (error recorded).
    ``which`` (like ``"job 2 of 3"``) is added to the job's label in messages."""
    from bench.placement import thread_env  # noqa: PLC0415
    from hpcrep.launch.mpirun import mpirun_command, mpirun_env  # noqa: PLC0415

    launch = nodes.mpirun_command if nodes is not None else mpirun_command

    path = job_args[job_args.index("--bench-json") + 1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    env = mpirun_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if cores_per_rank:
        env.update(thread_env(cores_per_rank))
    env.update(extra_env or {})
    command = launch(n, [python, "-m", JOBS[model]] + job_args)
    label = f"{model} x{n} ({job_args[job_args.index('--modes') + 1]})"
    if which:
        label += f" {which}"
    print(f"bench: {label} ...", flush=True)
    start, cpu_start = time.time(), _children_cpu_seconds()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        errors.append(f"{label}: timed out after {timeout} s")
        return None
    if proc.returncode != 0 or not os.path.exists(path):
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        errors.append(f"{label}: exit {proc.returncode}\n{tail}")
        print(f"bench: {label} FAILED (exit {proc.returncode})\n{tail}", flush=True)
        return None
    with open(path) as f:
        data = json.load(f)
    data["seconds"] = time.time() - start
    # CPU seconds of the job's processes: on an idle machine with a core per rank the job would
    # take about cpu_seconds / n of wall time, whatever the load was here.
    data["cpu_seconds"] = _children_cpu_seconds() - cpu_start
    print(f"bench: {label} done in {data['seconds']:.0f} s ({data['cpu_seconds']:.0f} CPU s)",
          flush=True)
    return data


def _children_cpu_seconds() -> float:
    """User plus system CPU seconds of every finished child process of this one (mpirun and the
    ranks it waited for)."""
    import resource  # noqa: PLC0415

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_allreduce(ranks: list[int], out: str, quick: bool, errors: list,
                  nodes: Any = None) -> dict:
    """Run the allreduce benchmark (``bench.allreduce.run``); record failures."""
    print(f"bench: allreduce benchmark at ranks {ranks} ...", flush=True)
    try:
        from bench import allreduce  # noqa: PLC0415

        return allreduce.run(ranks, out, quick=quick, cluster=nodes)
    except Exception as exc:  # noqa: BLE001 - record any failure of the peer benchmark
        errors.append(f"allreduce benchmark: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def free_port_base(n: int) -> int:
    """A port p such that p..p+n-1 were free a moment ago (for TF_CONFIG on localhost)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"could not find {n} consecutive free localhost ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def machine() -> dict:
    """The host facts a reader needs to compare reports."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"host": platform.node(), "cores": cores, "cpu": model, "memory_gib": round(mem, 1),
            "os": platform.platform(), "load_average": list(os.getloadavg())}


def versions() -> dict:
    """Versions of the stack (read from package metadata: no TensorFlow import here)."""
    from importlib import metadata  # noqa: PLC0415

    out = {"python": platform.python_version()}
    for dist in ("tensorflow-cpu", "tensorflow", "keras", "mpi4py", "numpy", "gymnasium",
                 "hpcrep", "horovod"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:  # the mpirun the jobs run under (beside this Python first, as run_job's launcher)
        from hpcrep.launch.mpirun import find_mpirun  # noqa: PLC0415

        mpirun = find_mpirun()
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[0]
        out["mpirun"] = f"{version} ({mpirun})"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        pass
    return out
