"""HDF5 checkpoints (numpy + h5py): atomic writes on rank 0, last-K retention, checksums with
fallback to the previous good file, restore to identical state on every rank, pre-timeout
signal handling. The Keras callback is
:class:`hpcrep.tensorflow.checkpoint_callback.CheckpointCallback`.

``requeue``, ``restart_count`` and ``slurm_job_id`` belong to the save-on-signal-then-requeue
pattern and are re-exported here; they are :mod:`hpcrep.slurm`'s."""

from hpcrep.checkpoint.h5file import checksum, read_verified, write_atomic
from hpcrep.checkpoint.manager import (Checkpoint, CheckpointFallbackWarning, CheckpointManager,
                                       flatten)
from hpcrep.checkpoint.preemption import PreemptionSignal
from hpcrep.checkpoint.rng import host_rng_state, set_host_rng_state
from hpcrep.slurm.environment import job_id as slurm_job_id
from hpcrep.slurm.environment import restart_count
from hpcrep.slurm.requeue import requeue

__all__ = ["CheckpointManager", "Checkpoint", "CheckpointFallbackWarning", "flatten",
           "write_atomic", "read_verified", "checksum", "PreemptionSignal", "requeue",
           "restart_count", "slurm_job_id", "host_rng_state", "set_host_rng_state"]
