"""Gradient compression before communication (Horovod's ``hvd.Compression``).

``Compression.none`` and ``Compression.fp16`` transform each tensor on its own (a
:class:`Compressor`: ``compress`` before the allreduce, ``decompress`` after).
``Compression.powersgd(rank, warmup_steps)`` is of another kind: stateful, two exchanges per
step over the whole list of gradients (:mod:`hpcrep.tensorflow.powersgd`); the gradient reducers
(``DistributedOptimizer``, ``DistributedGradientTape``) hand it their gradients instead of the
bucketed allreduce. Collectives on plain tensors (``hvd.allreduce``) take only the per-tensor
kind.
"""

from __future__ import annotations

from hpcrep.tensorflow.compressors import Compressor, FP16Compressor, NoneCompressor
from hpcrep.tensorflow.powersgd import PowerSGD


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.powersgd(rank, warmup_steps)``."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def powersgd(rank: int = 1, warmup_steps: int = 0, seed: int = 0) -> PowerSGD:
        """Return a new PowerSGD compression (:class:`hpcrep.tensorflow.powersgd.PowerSGD`):
        rank-``rank`` factors with error feedback, uncompressed for the first
        ``warmup_steps`` exchanges. Each optimizer or training loop needs its own. Local.

        Raises:
            CollectiveArgumentError: ``rank`` not an int or below 1, ``warmup_steps`` < 0.
        """
        return PowerSGD(rank, warmup_steps, seed)


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "PowerSGD"]
