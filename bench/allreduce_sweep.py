"""Fusion threshold x piece size sweep of ResNet-50's gradient allreduce
(``python -m bench.allreduce --sweep``): the grid an autotuner chooses from, so that a choice
can be set beside the best fixed setting.

One MPI job per fusion threshold (``HPCREP_FUSION_THRESHOLD``: the compiled engine fixes the
fusion of what it has queued when it starts), and in that job every piece size
(``HPCREP_ALLREDUCE_CHUNK``, read when a ``tf.function`` traces; 0 = each bucket in one MPI
call) as a variant of its own, timed in interleaved rounds (:func:`bench.timing.time_rounds`:
warm-up until step times settle, the slowest rank's time, median with min-max over rounds)
beside a raw in-place ``MPI_Allreduce`` of the same bytes. Jobs differ in placement and warm-up,
so cells are compared through their ratio to their own job's raw allreduce as well as in ms.

A variant is ``hvd.grouped_allreduce`` of ResNet-50's 214 gradient arrays (102 MB) inside a
``tf.function``, every result consumed in the graph, as a training step would.

A last job sets the autotuner (``HPCREP_AUTOTUNE``, :mod:`hpcrep.comm.autotune`) beside the
sweep's best cell: the same gradients through the optimizers' exchange
(:class:`hpcrep.tensorflow.gradients.GradientReducer`, Sum; 3-4 ms slower than the bare
``grouped_allreduce`` on one node) with the tuner on, run alone until it settles (the steps it
took are reported), then frozen and timed in interleaved rounds beside the best cell and the
defaults through the same exchange, each traced as a user would set them.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

THRESHOLDS = (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20)
CHUNKS = (1 << 20, 4 << 20, 16 << 20, 0)


def _mib(nbytes: int) -> str:
    return "whole bucket" if nbytes == 0 else f"{nbytes >> 20} MiB"


def worker(quick: bool) -> dict:
    """Time every piece size at this job's fusion threshold; return rank 0's results (others
    return {}).

    Collective: every rank of the job must call this.
    """
    from mpi4py import MPI  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    import tensorflow as tf  # noqa: PLC0415

    from bench.allreduce import resnet50_gradients, with_env  # noqa: PLC0415
    from bench.timing import time_rounds  # noqa: PLC0415
    from hpcrep import config  # noqa: PLC0415
    from hpcrep.comm import world  # noqa: PLC0415
    from hpcrep.tensorflow import native  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    grads = resnet50_gradients(comm.Get_rank())
    tensors = [tf.constant(g) for g in grads]
    flat = np.ones(sum(g.nbytes for g in grads) // 4, np.float32)

    def consumed() -> Any:
        return tf.function(lambda ts: tf.add_n(
            [tf.reshape(t, [-1])[0] for t in hvd.grouped_allreduce(ts, op=hvd.Sum)]))

    steps = {"raw_inplace": lambda: comm.Allreduce(MPI.IN_PLACE, flat)}
    for chunk in CHUNKS:
        fn = with_env("HPCREP_ALLREDUCE_CHUNK", str(chunk), consumed())
        steps[f"chunk_{chunk}"] = lambda fn=fn: fn(tensors).numpy()
    rounds, per_round = (3, 3) if quick else (5, 5)
    timed = time_rounds(steps, rounds, per_round, items_per_step=1.0)
    if comm.Get_rank() != 0:
        return {}
    return {"ranks": comm.Get_size(), "threshold": int(config.get("HPCREP_FUSION_THRESHOLD")),
            "path": "compiled" if native.active() else "python",
            "bytes": int(flat.nbytes), "tensors": len(grads),
            "nodes": world.communicator().nodes, "rounds": rounds, "steps_per_round": per_round,
            "raw_inplace": _figures(timed["raw_inplace"]),
            "chunks": {str(c): _figures(timed[f"chunk_{c}"]) for c in CHUNKS}}


def autotune_worker(best_threshold: int, best_chunk: int, quick: bool) -> dict:
    """Let the autotuner settle on ResNet-50's gradient exchange, then time it beside the
    sweep's best cell and the defaults; return rank 0's results (others return {}).

    Collective: every rank of the job must call this.
    """
    from mpi4py import MPI  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    import tensorflow as tf  # noqa: PLC0415

    from bench.allreduce import resnet50_gradients, with_env  # noqa: PLC0415
    from bench.overlap import settle_autotune  # noqa: PLC0415
    from bench.timing import time_rounds  # noqa: PLC0415
    from hpcrep.tensorflow import autotune  # noqa: PLC0415
    from hpcrep.tensorflow.gradients import GradientReducer  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    tensors = [tf.constant(g) for g in resnet50_gradients(comm.Get_rank())]

    def consumed(reduce: Any) -> Any:
        return tf.function(lambda ts: tf.add_n([tf.reshape(t, [-1])[0] for t in reduce(ts)]))

    def exchange(ts: Any) -> Any:
        return GradientReducer(op=hvd.Sum).reduce(ts)

    # All three through the optimizers' exchange (what training runs), traced with their settings.
    fixed = consumed(exchange)
    best_fn = with_env("HPCREP_ALLREDUCE_CHUNK", str(best_chunk), with_env(
        "HPCREP_FUSION_THRESHOLD", str(best_threshold), consumed(exchange)))
    tuned_fn = with_env("HPCREP_AUTOTUNE", "1", consumed(exchange))
    limit = 400
    settled = settle_autotune(lambda: tuned_fn(tensors), limit)  # alone, then frozen
    steps = {"default": lambda: fixed(tensors).numpy(),
             "best_fixed": lambda: best_fn(tensors).numpy(),
             "autotuned": lambda: tuned_fn(tensors).numpy()}
    rounds, per_round = (3, 3) if quick else (5, 5)
    timed = time_rounds(steps, rounds, per_round, items_per_step=1.0)
    if comm.Get_rank() != 0:
        return {}
    search = autotune.current().search
    return {"ranks": comm.Get_size(), "best_threshold": best_threshold, "best_chunk": best_chunk,
            "settled": settled["settled"], "settle_steps": settled["steps"], "limit": limit,
            "settle_seconds": settled["seconds"],
            "chosen": {"threshold": settled["threshold"], "chunk": settled["chunk"]},
            "trials": settled["trials"], "warmup": search.warmup, "measure": search.measure,
            "rounds": rounds, "steps_per_round": per_round,
            **{name: _figures(timed[name]) for name in steps}}


def _figures(t: dict) -> dict:
    return {"ms": t["step_ms"], "ms_min": t["step_ms_min"], "ms_max": t["step_ms_max"]}


def run(ranks: int, out_dir: str, quick: bool = False, cluster: Any = None) -> dict:
    """Run one job per fusion threshold at ``ranks`` ranks (across ``cluster``'s nodes when
    given, a :class:`bench.cluster.Cluster`); write allreduce_sweep.json/.md into ``out_dir``.

    Local: call from one process; it starts the MPI jobs itself.
    """
    from bench.allreduce import report_header, worker_job  # noqa: PLC0415
    from hpcrep.launch.mpirun import mpirun_command, mpirun_env  # noqa: PLC0415

    launch = cluster.mpirun_command if cluster is not None else mpirun_command
    os.makedirs(out_dir, exist_ok=True)
    report: dict[str, Any] = {
        **report_header("allreduce_sweep", cluster),
        "ranks": ranks, "thresholds": list(THRESHOLDS), "chunks": list(CHUNKS), "jobs": {},
    }
    for threshold in THRESHOLDS:
        env = mpirun_env()
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        env["HPCREP_FUSION_THRESHOLD"] = str(threshold)
        report["jobs"][str(threshold)] = worker_job(launch, ranks, "bench.allreduce_sweep",
                                                    ["--quick"] if quick else [], env)
    report["best"] = best(report)
    b = report["best"]
    env = mpirun_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    report["autotune"] = worker_job(
        launch, ranks, "bench.allreduce_sweep",
        ["--autotune", f"{b['threshold']},{b['chunk']}", *(["--quick"] if quick else [])], env)
    with open(os.path.join(out_dir, "allreduce_sweep.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "allreduce_sweep.md"), "w") as f:
        f.write(render_markdown(report))
    return report


def best(report: dict) -> dict:
    """The cell with the lowest median, and the default setting's cell beside it. Local."""
    from hpcrep import config  # noqa: PLC0415

    cells = [(job["chunks"][c]["ms"], int(t), int(c))
             for t, job in report["jobs"].items() for c in job["chunks"]]
    ms, threshold, chunk = min(cells)
    default = (int(config.SETTINGS["HPCREP_FUSION_THRESHOLD"].default),
               int(config.SETTINGS["HPCREP_ALLREDUCE_CHUNK"].default))
    default_ms = next((m for m, t, c in cells if (t, c) == default), None)
    return {"threshold": threshold, "chunk": chunk, "ms": ms, "default_threshold": default[0],
            "default_chunk": default[1], "default_ms": default_ms,
            "default_over_best": None if default_ms is None else default_ms / ms}


def render_markdown(report: dict) -> str:
    """Return the sweep's tables: ms per cell, and each cell over its job's raw allreduce."""
    jobs = report["jobs"]
    first = next(iter(jobs.values()))
    where = (f"across {report['cluster']['nodes']} nodes of the test cluster, links "
             f"{report['cluster']['link']}" if report.get("cluster") else "on this machine")
    lines = [f"# Fusion threshold x piece size sweep ({report['date']})", "",
             f"ResNet-50's gradient set ({first['tensors']} tensors, {first['bytes'] / 1e6:.1f} "
             f"MB), `hvd.grouped_allreduce` in `tf.function` with every result consumed in the "
             f"graph, {report['ranks']} ranks {where}, {first['path']} path. One job per fusion "
             f"threshold; in each, the piece sizes and a raw in-place MPI_Allreduce of the same "
             f"bytes take turns over {first['rounds']} rounds of {first['steps_per_round']} "
             "steps. Median of the rounds (slowest rank), [min-max] over rounds, in ms.", ""]
    head = "| fusion threshold | " + " | ".join(_mib(c) for c in report["chunks"]) + \
        " | raw in-place |"
    lines += [head, "|---|" + "---:|" * (len(report["chunks"]) + 1)]
    for t, job in jobs.items():
        cells = [f"{job['chunks'][str(c)]['ms']:.1f} [{job['chunks'][str(c)]['ms_min']:.1f}-"
                 f"{job['chunks'][str(c)]['ms_max']:.1f}]" for c in report["chunks"]]
        raw = job["raw_inplace"]
        lines.append(f"| {_mib(int(t))} | " + " | ".join(cells)
                     + f" | {raw['ms']:.1f} [{raw['ms_min']:.1f}-{raw['ms_max']:.1f}] |")
    lines += ["", "Each cell over its own job's raw in-place allreduce:", "",
              head.replace(" raw in-place |", ""), "|---|" + "---:|" * len(report["chunks"])]
    for t, job in jobs.items():
        raw = job["raw_inplace"]["ms"]
        lines.append(f"| {_mib(int(t))} | " + " | ".join(
            f"{job['chunks'][str(c)]['ms'] / raw:.2f}x" for c in report["chunks"]) + " |")
    b = report["best"]
    lines += ["", f"Best cell: fusion threshold {_mib(b['threshold'])}, pieces "
              f"{_mib(b['chunk'])}: {b['ms']:.1f} ms."]
    if b["default_ms"] is not None:
        lines.append(f"hpcrep's defaults ({_mib(b['default_threshold'])}, "
                     f"{_mib(b['default_chunk'])}): {b['default_ms']:.1f} ms, "
                     f"{b['default_over_best']:.2f}x the best cell.")
    if report.get("autotune"):
        lines += [""] + _autotune_lines(report["autotune"])
    return "\n".join(lines) + "\n"


def _autotune_lines(a: dict) -> list[str]:
    """The autotune job's section: what it chose, after how many steps, and its time beside the
    best cell's and the defaults' in the same job."""
    def cell(name: str) -> str:
        f = a[name]
        return f"{f['ms']:.1f} [{f['ms_min']:.1f}-{f['ms_max']:.1f}]"

    settled = (f"settled after {a['settle_steps']} steps ({a['settle_seconds']:.0f} s; "
               f"{len(a['trials'])} settings timed, {a['warmup']} + {a['measure']} steps each)"
               if a["settled"] else f"had not settled after {a['settle_steps']} steps")
    chosen = a["chosen"]
    return [
        "## Autotune (HPCREP_AUTOTUNE) beside the best cell", "",
        f"One more job: the same gradients through the optimizers' exchange (GradientReducer, "
        f"as training runs it) with the tuner on, run alone until it settled, then frozen and "
        f"timed in interleaved rounds beside the best cell and the defaults through the same "
        f"exchange (each traced as a user sets them). The tuner {settled} "
        f"on fusion {_mib(chosen['threshold'])}, pieces {_mib(chosen['chunk'])}.", "",
        "| variant | ms | over the best cell |", "|---|---:|---:|",
        f"| best cell ({_mib(a['best_threshold'])}, {_mib(a['best_chunk'])}) | "
        f"{cell('best_fixed')} | 1.00x |",
        f"| autotuned | {cell('autotuned')} | "
        f"{a['autotuned']['ms'] / a['best_fixed']['ms']:.2f}x |",
        f"| defaults | {cell('default')} | {a['default']['ms'] / a['best_fixed']['ms']:.2f}x |",
        "", "The tuner's timed settings (median step ms): " + "; ".join(
            f"{_mib(t['threshold'])}/{_mib(t['chunk'])}{' fp16' if t.get('fp16') else ''} "
            f"{t['ms']:.0f}" for t in a["trials"]) + "."]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry of the sweep's MPI jobs (``--worker JSON``); users run ``bench.allreduce --sweep``."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m bench.allreduce_sweep")
    parser.add_argument("--worker", metavar="JSON", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--autotune", metavar="THRESHOLD,CHUNK", default=None,
                        help="the autotuner's job, beside this best cell")
    args = parser.parse_args(argv)
    if args.autotune:
        threshold, chunk = (int(v) for v in args.autotune.split(","))
        results = autotune_worker(threshold, chunk, args.quick)
    else:
        results = worker(args.quick)
    if results:
        with open(args.worker, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
