"""Benchmark jobs across the multi-node test cluster (``tests/cluster``) instead of local ranks.

``hpcrep bench ... --cluster-nodes 2 --link 1gbit`` and ``python -m bench.allreduce ...
--cluster-nodes 2 --link 1gbit`` start the cluster (network namespaces on this machine, each
node's link capped at the given rate), run every MPI job across its nodes with ranks spread
evenly (``--map-by ppr:K:node``), and remove the cluster afterwards (``tests/cluster/down.sh``).
Needs root, like the cluster itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
from typing import Iterator, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "cluster")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")


def link_bytes_per_second(link: str) -> float:
    """Return the byte rate of a tc rate such as ``1gbit`` or ``500mbit``.

    Raises:
        ValueError: ``link`` is not such a rate.
    """
    match = _RATE.match(link.strip().lower())
    if not match:
        raise ValueError(f"--link must be a rate such as 500mbit, 1gbit or 10gbit, got {link!r}")
    scale = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]
    return float(match.group(1)) * scale / 8


def allreduce_lower_bound_ms(nbytes: int, nodes: int, link: str) -> float:
    """Return the least time, in ms, any allreduce of ``nbytes`` needs across ``nodes`` links.

    A bandwidth-optimal allreduce sends ``2 (p - 1) / p`` times the buffer out of every one of
    the ``p`` nodes (reduce-scatter, then allgather), and each node's link carries at most the
    cap in each direction.
    """
    return 2 * (nodes - 1) / nodes * nbytes / link_bytes_per_second(link) * 1e3


class Cluster:
    """A running test cluster that MPI jobs are launched across."""

    def __init__(self, nodes: int, link: Optional[str]) -> None:
        self.nodes, self.link = nodes, link

    def mpirun_command(self, n: int, command: Sequence[str]) -> list[str]:
        """Return the argv that runs ``command`` on ``n`` ranks spread evenly over the nodes."""
        per_node = math.ceil(n / self.nodes)
        return [os.path.join(SCRIPTS, "mpirun.sh"), "-n", str(n), "--map-by",
                f"ppr:{per_node}:node", "--", *command]

    def describe(self) -> dict:
        """What a report records about the cluster."""
        return {"nodes": self.nodes, "link": self.link or "uncapped",
                "how": "tests/cluster: network namespaces on one machine, tc tbf link caps"}


@contextlib.contextmanager
def cluster(nodes: int, link: Optional[str]) -> Iterator[Cluster]:
    """Start the test cluster with ``nodes`` nodes and ``link`` caps; remove it on exit.

    Raises:
        RuntimeError: the cluster cannot be started (not root, a capability missing); the
            message is ``up.sh``'s.
    """
    if link is not None:
        link_bytes_per_second(link)  # a clear error before anything starts
    if os.geteuid() != 0:
        raise RuntimeError("--cluster-nodes needs root: the cluster is made of network "
                           "namespaces (tests/cluster/up.sh); run the benchmark as root")
    argv = ["bash", os.path.join(SCRIPTS, "up.sh"), "--nodes", str(nodes), "--no-slurm"]
    if link:
        argv += ["--link", link]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"tests/cluster/up.sh failed: {done.stderr.strip() or done.stdout}")
    try:
        yield Cluster(nodes, link)
    finally:
        subprocess.run(["bash", os.path.join(SCRIPTS, "down.sh")], capture_output=True,
                       timeout=120)
