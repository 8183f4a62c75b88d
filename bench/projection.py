"""Projected scaling efficiency at 8..1024 ranks from measured compute and communication costs.

Cost model of one ring allreduce of ``B`` bytes on ``p`` ranks (Patarasuk & Yuan 2009; Thakur
et al. 2005)::

    t(p) = t_sw + 2 (p - 1) / p * B / bw + 2 (p - 1) * alpha

``bw`` and ``alpha`` are the stated network's bandwidth and per-message latency; ``bw`` is capped
by the memcpy bandwidth measured here (a rank cannot reduce faster than it copies), and ``t_sw``
is hpcrep's measured per-call software overhead (a 1 KB allreduce inside ``tf.function``).
A step with compute time ``t_c`` and ``k`` gradient exchanges then takes

- without overlap: ``t_c + k t(p)``;
- with overlap of communication and backprop: ``t_c + max(0, k t(p) - f t_c)``, where
  ``f = 2/3`` is the share of a step spent in the backward pass that can hide communication.

Efficiency is ``t_c`` over the step time (weak scaling: 1 rank needs no exchange).
"""

from __future__ import annotations

from typing import Any

RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
NETWORK = {"name": "100 Gb/s Ethernet/InfiniBand class", "bandwidth_gbps": 12.5,
           "latency_us": 2.0}
BACKWARD_FRACTION = 2.0 / 3.0


def allreduce_seconds(nbytes: float, p: int, bandwidth_gbps: float, latency_s: float,
                      software_s: float) -> float:
    """Ring-allreduce time of ``nbytes`` on ``p`` ranks (see the module docstring)."""
    if p <= 1:
        return 0.0
    return software_s + 2 * (p - 1) / p * nbytes / (bandwidth_gbps * 1e9) + 2 * (p - 1) * latency_s


def project(models: dict[str, dict], memcpy_gbps: float, software_ms: float,
            network: dict = NETWORK, ranks: list[int] = RANKS) -> dict[str, Any]:
    """Return the projection for ``models``: name -> {compute_ms, grad_bytes, syncs_per_step}.

    ``memcpy_gbps`` and ``software_ms`` are measured on this machine (allreduce benchmark).
    """
    bandwidth = min(network["bandwidth_gbps"], memcpy_gbps) if memcpy_gbps else network[
        "bandwidth_gbps"]
    latency = network["latency_us"] * 1e-6
    out: dict[str, Any] = {"network": dict(network), "effective_bandwidth_gbps": bandwidth,
                           "software_ms": software_ms, "memcpy_gbps": memcpy_gbps,
                           "backward_fraction": BACKWARD_FRACTION, "ranks": list(ranks),
                           "models": {}}
    for name, m in models.items():
        t_c = m["compute_ms"] / 1e3
        rows = {"no_overlap": [], "overlap": [], "comm_ms": []}
        for p in ranks:
            t_comm = m.get("syncs_per_step", 1) * allreduce_seconds(
                m["grad_bytes"], p, bandwidth, latency, software_ms / 1e3)
            rows["comm_ms"].append(t_comm * 1e3)
            rows["no_overlap"].append(t_c / (t_c + t_comm))
            rows["overlap"].append(t_c / (t_c + max(0.0, t_comm - BACKWARD_FRACTION * t_c)))
        out["models"][name] = dict(m, **rows)
    return out
