"""The cluster benchmark's arithmetic: link rates and the allreduce lower bound."""

import pytest

from bench.cluster import Cluster, allreduce_lower_bound_ms, link_bytes_per_second


def test_link_rates_parse_like_tc():
    assert link_bytes_per_second("1gbit") == 125e6
    assert link_bytes_per_second("10gbit") == 1.25e9
    assert link_bytes_per_second("500mbit") == 62.5e6
    with pytest.raises(ValueError, match="500mbit, 1gbit or 10gbit"):
        link_bytes_per_second("1GB/s")


def test_lower_bound_is_the_buffer_through_the_link_at_two_nodes():
    # 2 nodes: each sends half in the reduce-scatter and half in the allgather, one buffer.
    assert allreduce_lower_bound_ms(125_000_000, 2, "1gbit") == pytest.approx(1000.0)
    assert allreduce_lower_bound_ms(125_000_000, 4, "1gbit") == pytest.approx(1500.0)


def test_ranks_are_spread_evenly_over_the_nodes():
    argv = Cluster(2, "1gbit").mpirun_command(4, ["python", "x.py"])
    assert argv[1:6] == ["-n", "4", "--map-by", "ppr:2:node", "--"]
    assert Cluster(2, None).mpirun_command(2, ["a"])[4] == "ppr:1:node"
