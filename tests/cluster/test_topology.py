"""Topology across the nodes: every rank's local and cross ranks follow the node it runs on."""

import json
import re
import sys

import pytest

PROBE = "tests/cluster/topology_probe.py"


def topology(cluster, options):
    done = cluster.mpirun(options, [sys.executable, PROBE], timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    # ranks print concurrently, so two lines may share one line of mpirun's output
    ranks = [json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", done.stdout)]
    return sorted(ranks, key=lambda r: r["rank"])


@pytest.mark.timeout(180)
def test_two_ranks_on_each_of_two_nodes(cluster):
    ranks = topology(cluster, ["-n", "4", "--map-by", "ppr:2:node"])
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2", "node2"]
    for r in ranks:
        assert r["size"] == 4
        assert (r["local_rank"], r["local_size"]) == (r["rank"] % 2, 2), r
        assert (r["cross_rank"], r["cross_size"]) == (r["rank"] // 2, 2), r

@pytest.mark.timeout(180)
def test_uneven_nodes_two_ranks_and_one(cluster):
    # 3 ranks, 2 slots a node: node1 runs 2 and node2 runs 1. A topology derived from the
    # process count (or assuming equal nodes) gets local_size and cross_size wrong here.
    ranks = topology(cluster, ["-n", "3"])
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2"]
    got = [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in ranks]
    assert got == [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)], got
