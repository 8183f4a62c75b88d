"""Projected weak-scaling efficiency at 8..1024 ranks, from what hpcrep does and this run measured.

Only mechanisms hpcrep has, each with parameters measured in the same benchmark run:

- one exchange of ``B`` gradient bytes is one ``tf.numpy_function`` call (software overhead
  ``t_sw``, measured: a 1 KB allreduce inside ``tf.function``) that reduces ``m`` fusion buffers
  of at most ``HPCREP_FUSION_THRESHOLD`` bytes, each one ring allreduce (Patarasuk & Yuan 2009;
  Thakur et al. 2005)::

      t(p) = t_sw + 2 (p - 1) / p * B / bw + m * 2 (p - 1) * alpha

  ``bw`` and ``alpha`` are the stated network's bandwidth and per-message latency; ``bw`` is
  capped by the memcpy bandwidth measured here when it was measured (a rank cannot reduce faster
  than it copies), and left uncapped, with a note, when it was not;
- a step with compute time ``t_c`` (the 1-rank no-sync step measured here, at the run's cores
  per rank) and ``k`` exchanges takes ``t_c + k t(p)``;
- overlap of communication with the backward pass is projected only for a model whose results
  carry a measured ``overlap_fraction`` (the share of its communication time that hpcrep hid
  behind compute in this run): ``t_c + (1 - overlap_fraction) k t(p)``. hpcrep without such a
  figure gets no overlap row.

Efficiency is ``t_c`` over the step time (weak scaling: 1 rank needs no exchange). Without a
measured software overhead (the allreduce benchmark did not run) there is no projection.
"""

from __future__ import annotations

import math
from typing import Any, Optional

RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
NETWORK = {"name": "100 Gb/s Ethernet/InfiniBand class", "bandwidth_gbps": 12.5,
           "latency_us": 2.0}


def allreduce_seconds(nbytes: float, p: int, bandwidth_gbps: float, latency_s: float,
                      software_s: float, messages: int = 1) -> float:
    """Time of one exchange of ``nbytes`` in ``messages`` ring allreduces on ``p`` ranks (see the
    module docstring); 0 on one rank."""
    if p <= 1:
        return 0.0
    return (software_s + 2 * (p - 1) / p * nbytes / (bandwidth_gbps * 1e9)
            + messages * 2 * (p - 1) * latency_s)


def fusion_buffers(nbytes: float, threshold: int, tensors: int = 1) -> int:
    """How many fusion buffers of at most ``threshold`` bytes carry ``nbytes`` in ``tensors``
    tensors (at least 1; threshold 0 turns packing off: one buffer per tensor)."""
    if threshold <= 0:
        return max(1, tensors)
    return max(1, math.ceil(nbytes / threshold))


def project(models: dict[str, dict], software_ms: Optional[float],
            memcpy_gbps: Optional[float], fusion_threshold: int,
            network: dict = NETWORK, ranks: list[int] = RANKS) -> dict[str, Any]:
    """Return the projection for ``models``: name -> {compute_ms, grad_bytes, grad_tensors,
    syncs_per_step, optional overlap_fraction}, all measured in this run.

    ``software_ms`` and ``memcpy_gbps`` are measured by the allreduce benchmark of the same run
    (None: not measured). Without ``software_ms`` the result is ``{"omitted": reason}``.
    """
    if not software_ms:
        return {"omitted": "no measured software overhead per allreduce (the allreduce benchmark "
                           "did not run or failed; run without --no-allreduce)"}
    capped = bool(memcpy_gbps) and memcpy_gbps < network["bandwidth_gbps"]
    bandwidth = memcpy_gbps if capped else network["bandwidth_gbps"]
    latency = network["latency_us"] * 1e-6
    out: dict[str, Any] = {"network": dict(network), "effective_bandwidth_gbps": bandwidth,
                           "software_ms": software_ms, "memcpy_gbps": memcpy_gbps or None,
                           "capped_by_memcpy": capped, "fusion_threshold": fusion_threshold,
                           "ranks": list(ranks), "models": {}}
    for name, m in models.items():
        t_c = m["compute_ms"] / 1e3
        buffers = fusion_buffers(m["grad_bytes"], fusion_threshold, m.get("grad_tensors", 1))
        comm = [m.get("syncs_per_step", 1) * allreduce_seconds(
            m["grad_bytes"], p, bandwidth, latency, software_ms / 1e3, buffers) for p in ranks]
        rows = {"fused": [t_c / (t_c + c) for c in comm]}
        hidden = m.get("overlap_fraction")
        if hidden is not None:
            rows["measured_overlap"] = [t_c / (t_c + (1 - hidden) * c) for c in comm]
        out["models"][name] = dict(m, buffers=buffers, comm_ms=[c * 1e3 for c in comm],
                                   rows=rows)
    return out
