"""HDF5 checkpoints (numpy + h5py): atomic writes on rank 0, last-K retention, checksums with
fallback to the previous good file, restore to identical state on every rank, pre-timeout
signal handling and Slurm requeue. The Keras callback is
:class:`hpcrep.tensorflow.checkpoint_callback.CheckpointCallback`."""

from hpcrep.checkpoint.h5file import checksum, read_verified, write_atomic
from hpcrep.checkpoint.manager import (Checkpoint, CheckpointFallbackWarning, CheckpointManager,
                                       flatten)
from hpcrep.checkpoint.preemption import PreemptionSignal, requeue, restart_count, slurm_job_id
from hpcrep.checkpoint.rng import host_rng_state, set_host_rng_state

__all__ = ["CheckpointManager", "Checkpoint", "CheckpointFallbackWarning", "flatten",
           "write_atomic", "read_verified", "checksum", "PreemptionSignal", "requeue",
           "restart_count", "slurm_job_id", "host_rng_state", "set_host_rng_state"]
