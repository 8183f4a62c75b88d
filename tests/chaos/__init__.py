"""A seeded fault campaign for hpcrep's recovery paths (``make chaos``, ``make chaos-quick``):
random faults (SIGKILL, SIGSTOP, a raising rank, a kill during a write, a damaged checkpoint, a
second fault during recovery) at random moments of small jobs, in each recovery mode, judged by
oracles (no hang, no process left, bitwise the reference's weights, every row trained once).
See tests/chaos/README.md."""
