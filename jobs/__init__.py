"""The reference workloads of TF-Replicator (Buchlovsky et al. 2019), one package each, written
against hpcrep's public API: :mod:`jobs.resnet`, :mod:`jobs.sngan`, :mod:`jobs.d4pg`.

Run from the repository's top directory: ``mpirun -n N python -m jobs.resnet [options]``.
The single-file scripts beside them are examples (transparent mode, the Replicator).
"""
