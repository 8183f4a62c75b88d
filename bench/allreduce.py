"""Allreduce benchmark: raw mpi4py against hpcrep on numpy and on TF tensors inside tf.function.

``python -m bench.allreduce --ranks 2,4 [--out DIR] [--quick]`` starts one MPI job per rank count
and writes ``DIR/allreduce.json`` and ``DIR/allreduce.md``. For message sizes from 4 KB to 256 MB
and for ResNet-50's real gradient set (the trainable variables of
``keras.applications.ResNet50(weights=None)``) it times, in the same job:

- ``raw``: one mpi4py ``Allreduce(send, recv)`` on preallocated numpy arrays;
- ``raw_inplace``: one mpi4py ``Allreduce(IN_PLACE, buf)``, the fastest raw form here;
- ``hpcrep_numpy``: :func:`hpcrep.comm.allreduce` (Sum) on numpy;
- ``hpcrep_tf``: ``hvd.grouped_allreduce`` (Sum) of TF tensors inside ``tf.function``;
- ``hpcrep_tf_flat`` and ``hpcrep_tf_hier``: the same with ``HPCREP_HIERARCHICAL_ALLREDUCE`` 0
  and 1, only where the ranks span several nodes and some node runs more than one (where the
  hierarchical path applies).

With ``--cluster-nodes N [--link RATE]`` the jobs run across the multi-node test cluster
(``tests/cluster``, root only) with ranks spread evenly over its nodes, and the report gives the
link cap's lower bound for each size (:func:`bench.cluster.allreduce_lower_bound_ms`).

Each figure is the median over repetitions of the slowest rank's time; the four variants take
turns within each repetition. A single-process memcpy of 256 MB gives the ceiling for
shared-memory reductions on this machine.

``--sweep`` times ResNet-50's gradient set at a grid of fusion thresholds and piece sizes
instead (:mod:`bench.allreduce_sweep`; ``allreduce_sweep.json``/``.md``), at the first rank count
of ``--ranks``, on this machine or across the cluster.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def memcpy_gbps(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Return single-process memcpy bandwidth in GB/s (the ceiling of a shared-memory reduce)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(reps))
    return nbytes / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _reps_for(nbytes: int, quick: bool) -> int:
    budget = 0.3 if quick else 1.0  # seconds of timed work per measurement, roughly
    per_op = 20e-6 + nbytes / 2e9
    return int(max(3, min(200 if not quick else 50, budget / per_op)))


def _interleaved_medians(comm: Any, variants: dict[str, Callable[[], Any]], reps: int
                         ) -> dict[str, float]:
    """Median over ``reps`` of the slowest rank's time of each variant, in ms. Collective.

    The variants take turns within every repetition, in :func:`bench.timing.interleaved_order`
    (rotated every repetition), so a slow spell on this shared 2-core machine hits all of them
    alike and the ratios between them stay fair.
    """
    from mpi4py import MPI  # noqa: PLC0415

    from bench.timing import interleaved_order  # noqa: PLC0415

    for fn in variants.values():
        fn()  # warm-up: first-touch pages, traces, pools
    index = {name: k for k, name in enumerate(variants)}
    times = np.empty((len(variants), reps))
    for i, names in enumerate(interleaved_order(list(variants), reps)):
        for name in names:
            comm.Barrier()
            times[index[name], i] = _timed(variants[name])
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return {name: float(np.median(times[k]) * 1e3) for k, name in enumerate(variants)}


def with_env(name: str, value: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``fn`` called with environment setting ``name=value``: hpcrep reads its settings
    when a function traces, so a ``tf.function`` traced this way keeps them. Local."""
    def call(*args: Any) -> Any:
        before = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn(*args)
        finally:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before
    return call


def small_collectives(comm: Any, reps: int) -> dict[str, float]:
    """Time what small collectives cost inside ``tf.function`` on both allreduce paths, with the
    calls they are judged against, in one interleaved run (ms, medians of the slowest rank):

    - ``trivial_fn``: a ``tf.function`` adding 1 to a 1 KB tensor; ``raw_1kb``: one mpi4py
      in-place ``Allreduce`` of 1 KB; ``allreduce_1kb``: ``hvd.allreduce`` of 1 KB in a
      ``tf.function`` (the target: at most trivial_fn + raw_1kb, times 1.25);
    - ``separate_53``: 53 separate 1 KB ``hvd.allreduce`` calls in one ``tf.function`` (the
      shape of per-layer batch-norm statistics); ``grouped_53``: one ``grouped_allreduce`` of them.

    Names ending in ``_python`` ran with ``HPCREP_NATIVE=off``. Collective.
    """
    from mpi4py import MPI  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    x = tf.fill([256], float(comm.Get_rank()))
    xs = [tf.fill([256], float(comm.Get_rank() + i)) for i in range(53)]
    buf = np.ones(256, np.float32)
    trivial = tf.function(lambda a: a + 1.0)
    variants: dict[str, Callable[[], Any]] = {
        "trivial_fn": lambda: trivial(x).numpy(),
        "raw_1kb": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
    }
    for suffix, mode in (("", "auto"), ("_python", "off")):
        one = with_env("HPCREP_NATIVE", mode, tf.function(lambda a: hvd.allreduce(a, op=hvd.Sum)))
        sep = with_env("HPCREP_NATIVE", mode, tf.function(lambda *a: tf.add_n(
            [hvd.allreduce(t, op=hvd.Sum, name=f"s{i}")[0] for i, t in enumerate(a)])))
        grp = with_env("HPCREP_NATIVE", mode, tf.function(lambda *a: tf.add_n(
            [t[0] for t in hvd.grouped_allreduce(list(a), op=hvd.Sum)])))
        variants[f"allreduce_1kb{suffix}"] = lambda one=one: one(x).numpy()
        variants[f"separate_53{suffix}"] = lambda sep=sep: sep(*xs).numpy()
        variants[f"grouped_53{suffix}"] = lambda grp=grp: grp(*xs).numpy()
    out = _interleaved_medians(comm, variants, reps)
    for suffix in ("", "_python"):
        out[f"ratio_1kb{suffix}"] = out[f"allreduce_1kb{suffix}"] / (out["trivial_fn"]
                                                                   + out["raw_1kb"])
        out[f"ratio_53{suffix}"] = out[f"separate_53{suffix}"] / out[f"grouped_53{suffix}"]
    return out


def _hierarchical(on: bool, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` with the hierarchical allreduce on or off (every rank alike)."""
    before = os.environ.get("HPCREP_HIERARCHICAL_ALLREDUCE")
    os.environ["HPCREP_HIERARCHICAL_ALLREDUCE"] = "1" if on else "0"
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["HPCREP_HIERARCHICAL_ALLREDUCE"]
        else:
            os.environ["HPCREP_HIERARCHICAL_ALLREDUCE"] = before


def resnet50_gradients(seed: int) -> list[np.ndarray]:
    """Random float32 arrays shaped like the trainable variables of
    ``keras.applications.ResNet50(weights=None)`` (214 arrays, 102 MB), drawn from ``seed``.
    Local."""
    import keras  # noqa: PLC0415

    model = keras.applications.ResNet50(weights=None)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    del model
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def worker(quick: bool, resnet_only: bool = False) -> dict:
    """Run the measurements inside an MPI job; return rank 0's results (others return {}).

    Collective: every rank of the job must call this.
    """
    from mpi4py import MPI  # noqa: PLC0415

    import hpcrep.tensorflow as hvd  # noqa: PLC0415

    hvd.init()
    import tensorflow as tf  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    results: dict[str, Any] = {"ranks": comm.Get_size(), "sizes": []}

    def measure(arrays: Sequence[np.ndarray], reps: int) -> dict:
        total = sum(a.nbytes for a in arrays)
        flat = np.ones(total // 4, np.float32)
        out = np.empty_like(flat)
        tensors = [tf.constant(a) for a in arrays]
        graph = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))
        # Consumed inside the graph, as a training step would (one element of each result is
        # read, so every result must exist; only a scalar leaves the function).
        consumed = tf.function(lambda ts: tf.add_n(
            [tf.reshape(t, [-1])[0] for t in hvd.grouped_allreduce(ts, op=hvd.Sum)]))
        python_consumed = with_env("HPCREP_NATIVE", "off", tf.function(lambda ts: tf.add_n(
            [tf.reshape(t, [-1])[0] for t in hvd.grouped_allreduce(ts, op=hvd.Sum)])))
        row: dict[str, Any] = {"bytes": int(total), "tensors": len(arrays), "reps": reps}
        variants = {
            "raw_ms": lambda: comm.Allreduce(flat, out),
            "raw_inplace_ms": lambda: comm.Allreduce(MPI.IN_PLACE, out),
            "hpcrep_numpy_ms": lambda: hvd_comm.grouped_allreduce(arrays, hvd_comm.Sum),
            "hpcrep_tf_ms": lambda: graph(tensors),
            "hpcrep_tf_consumed_ms": lambda: consumed(tensors).numpy(),
            "hpcrep_tf_python_consumed_ms": lambda: python_consumed(tensors).numpy(),
        }
        if hierarchical_applies:
            variants["hpcrep_tf_flat_ms"] = lambda: _hierarchical(False, lambda: graph(tensors))
            variants["hpcrep_tf_hier_ms"] = lambda: _hierarchical(True, lambda: graph(tensors))
        row.update(_interleaved_medians(comm, variants, reps))
        return row

    import hpcrep.comm as hvd_comm  # noqa: PLC0415

    job = hvd_comm.world.communicator()
    hierarchical_applies = job.nodes > 1 and job.widest_node > 1
    results["nodes"] = job.nodes
    results["ranks_per_node"] = comm.allgather(hvd_comm.local_size())

    for nbytes in ([] if resnet_only else QUICK_SIZES if quick else SIZES):
        results["sizes"].append(measure([np.ones(nbytes // 4, np.float32)],
                                        _reps_for(nbytes, quick)))
    tiny = [np.ones(256, np.float32)]  # 1 KB
    results["latency_1kb"] = measure(tiny, 50 if quick else 200)
    results["small"] = small_collectives(comm, 100 if quick else 300)

    resnet = measure(resnet50_gradients(comm.Get_rank()), 5 if quick else 15)
    resnet["ratio_vs_raw_inplace"] = resnet["hpcrep_tf_ms"] / resnet["raw_inplace_ms"]
    resnet["ratio_vs_raw"] = resnet["hpcrep_tf_ms"] / resnet["raw_ms"]
    resnet["ratio_consumed_vs_raw_inplace"] = (resnet["hpcrep_tf_consumed_ms"]
                                               / resnet["raw_inplace_ms"])
    resnet["ratio_python_consumed_vs_raw_inplace"] = (resnet["hpcrep_tf_python_consumed_ms"]
                                                      / resnet["raw_inplace_ms"])
    results["resnet50"] = resnet
    return results if comm.Get_rank() == 0 else {}


def report_header(benchmark: str, cluster: Any = None) -> dict[str, Any]:
    """The fields every allreduce report opens with: its name, the date, this machine, and the
    test cluster's description when the jobs ran across it. Local."""
    return {"benchmark": benchmark,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "cluster": cluster.describe() if cluster is not None else None}


def run(ranks: Sequence[int], out_dir: str, quick: bool = False, cluster: Any = None,
        resnet_only: bool = False) -> dict:
    """Benchmark at each rank count (one MPI job each); write allreduce.json/.md into ``out_dir``.

    ``cluster`` (a :class:`bench.cluster.Cluster`) runs the jobs across its nodes instead of on
    local ranks. Local: call from one process; it starts the MPI jobs itself.
    """
    from hpcrep.launch.mpirun import mpirun_command, mpirun_env  # noqa: PLC0415

    launch = cluster.mpirun_command if cluster is not None else mpirun_command

    os.makedirs(out_dir, exist_ok=True)
    report: dict[str, Any] = {**report_header("allreduce", cluster),
                              "memcpy_gbps": memcpy_gbps(), "runs": {}}
    env = mpirun_env()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for n in ranks:
        args = (["--quick"] if quick else []) + (["--resnet-only"] if resnet_only else [])
        report["runs"][str(n)] = worker_job(launch, n, "bench.allreduce", args, env)
    with open(os.path.join(out_dir, "allreduce.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "allreduce.md"), "w") as f:
        f.write(render_markdown(report))
    return report


def worker_job(launch: Callable[[int, list], list], n: int, module: str, args: Sequence[str],
               env: dict) -> dict:
    """Run ``python -m MODULE --worker JSON ARGS`` on ``n`` ranks through ``launch`` (an
    mpirun-command builder) and return what rank 0 wrote to JSON. Local."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    try:
        subprocess.run(launch(n, [sys.executable, "-m", module, "--worker", path, *args]),
                       env=env, check=True)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms / 1e3) / 1e9


def render_markdown(report: dict) -> str:
    """Return the Markdown tables of an allreduce report."""
    lines = [f"# Allreduce benchmark ({report['date']})", "",
             f"memcpy ceiling: {report['memcpy_gbps']:.1f} GB/s (one process, 256 MB).", "",
             "Times are medians of the slowest rank, in ms; GB/s is bytes / time.", ""]
    cluster = report.get("cluster")
    if cluster:
        lines += [f"Across the test cluster: {cluster['nodes']} nodes, each link capped at "
                  f"{cluster['link']} ({cluster['how']}). 'link bound' is the least time any "
                  "allreduce needs through those links.", ""]
    for n, run_ in report["runs"].items():
        flat = "hpcrep_tf_flat_ms" in run_["resnet50"]
        bound = cluster and cluster["link"] != "uncapped"
        head = ("| bytes | raw | raw in-place | hpcrep numpy | hpcrep tf.function | "
                + ("hpcrep tf flat | hpcrep tf hierarchical | " if flat else "")
                + ("link bound | " if bound else "")
                + "tf / raw in-place | hpcrep tf GB/s |")
        lines += [f"## {n} ranks{_layout(run_)}", "", head,
                  "|" + "---:|" * (head.count("|") - 1)]
        for row in run_["sizes"] + [run_["latency_1kb"], run_["resnet50"]]:
            label = _label(row)
            cells = [label, f"{row['raw_ms']:.3f}", f"{row['raw_inplace_ms']:.3f}",
                     f"{row['hpcrep_numpy_ms']:.3f}", f"{row['hpcrep_tf_ms']:.3f}"]
            if flat:
                cells += [f"{row['hpcrep_tf_flat_ms']:.3f}", f"{row['hpcrep_tf_hier_ms']:.3f}"]
            if bound:
                cells.append(f"{_bound_ms(row['bytes'], run_, cluster):.3f}")
            cells += [f"{row['hpcrep_tf_ms'] / row['raw_inplace_ms']:.2f}x",
                      f"{_gbps(row['bytes'], row['hpcrep_tf_ms']):.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        r50 = run_["resnet50"]
        lines += ["", f"ResNet-50 gradient set ({r50['tensors']} tensors, "
                  f"{r50['bytes'] / 1e6:.1f} MB): hpcrep grouped_allreduce in tf.function takes "
                  f"{r50['ratio_vs_raw_inplace']:.2f}x one raw in-place Allreduce of the same "
                  f"bytes ({r50['ratio_vs_raw']:.2f}x the out-of-place one); with the results "
                  "consumed inside the graph "
                  f"{r50.get('ratio_consumed_vs_raw_inplace', float('nan')):.2f}x on the "
                  "active path, "
                  f"{r50.get('ratio_python_consumed_vs_raw_inplace', float('nan')):.2f}x on the "
                  "Python path. 1 KB allreduce in "
                  f"tf.function: {run_['latency_1kb']['hpcrep_tf_ms']:.3f} ms.", ""]
        small = run_.get("small")
        if small:
            lines += ["| small collectives (ms) | compiled path | Python path |",
                      "|---|---:|---:|",
                      f"| trivial tf.function call | {small['trivial_fn']:.3f} | |",
                      f"| raw 1 KB MPI_Allreduce | {small['raw_1kb']:.4f} | |"]
            for key, label in (("allreduce_1kb", "1 KB allreduce in tf.function"),
                               ("ratio_1kb", "... / (trivial call + raw 1 KB)"),
                               ("separate_53", "53 separate 1 KB allreduces"),
                               ("grouped_53", "one grouped_allreduce of them"),
                               ("ratio_53", "separate / grouped")):
                lines.append(f"| {label} | {small[key]:.3f} | {small[key + '_python']:.3f} |")
            lines.append("")
    return "\n".join(lines)


def _layout(run_: dict) -> str:
    """' on 2 nodes (2 per node at most)' for a multi-node run, else nothing."""
    nodes = run_.get("nodes", 1)
    if nodes <= 1:
        return ""
    per = run_.get("ranks_per_node", [])
    return f" on {nodes} nodes ({max(per) if per else '?'} per node at most)"


def _bound_ms(nbytes: int, run_: dict, cluster: dict) -> float:
    from bench.cluster import allreduce_lower_bound_ms  # noqa: PLC0415

    return allreduce_lower_bound_ms(nbytes, run_.get("nodes", cluster["nodes"]), cluster["link"])


def _label(row: dict) -> str:
    if row["tensors"] > 1:
        return f"ResNet-50 grads ({row['tensors']} tensors, {row['bytes'] / 1e6:.1f} MB)"
    b = row["bytes"]
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allreduce", description=__doc__)
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    parser.add_argument("--out", default=None, help="output directory (default reports/<time>)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--cluster-nodes", type=int, default=0,
                        help="run across this many nodes of the test cluster (root)")
    parser.add_argument("--link", help="cap each cluster node's link, e.g. 1gbit, 10gbit")
    parser.add_argument("--resnet-only", action="store_true",
                        help="only ResNet-50's gradient set and the 1 KB latency (no size sweep)")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: ResNet-50's gradient set at a grid of fusion thresholds "
                             "and piece sizes, at the first of --ranks (bench/allreduce_sweep.py)")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        results = worker(args.quick, args.resnet_only)
        if results:
            with open(args.worker, "w") as f:
                json.dump(results, f)
        return 0
    out = args.out or os.path.join("reports", time.strftime("%Y%m%d-%H%M%S"))
    ranks = [int(x) for x in args.ranks.split(",")]
    if args.sweep:
        from bench import allreduce_sweep as sweep  # noqa: PLC0415

        measure, render, name = (lambda nodes: sweep.run(ranks[0], out, args.quick, nodes),
                                 sweep.render_markdown, "allreduce_sweep")
    else:
        measure, render, name = (lambda nodes: run(ranks, out, args.quick, nodes,
                                                   args.resnet_only), render_markdown, "allreduce")
    if args.cluster_nodes:
        from bench.cluster import cluster  # noqa: PLC0415

        with cluster(args.cluster_nodes, args.link) as nodes:
            report = measure(nodes)
    else:
        report = measure(None)
    print(render(report))
    print(f"wrote {out}/{name}.json and {out}/{name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
