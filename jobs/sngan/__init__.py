"""Class-conditional SN-GAN (Miyato & Koyama 2018) under a ``Replicator``, with batch-norm
statistics across replicas: :mod:`jobs.sngan.model` (networks, losses, the replicated steps),
:mod:`jobs.sngan.spectral_norm`, :mod:`jobs.sngan.train` (data, loop, benchmark entry)."""
