"""The one exception hierarchy of hpcrep.

Every error hpcrep raises derives from :class:`HpcrepError`. Errors that describe a bad argument
also derive from :class:`ValueError` (or :class:`TypeError`), and unsupported combinations from
:class:`NotImplementedError`, so that callers who catch the builtin exceptions, as Horovod users
do, keep working. This module never imports TensorFlow: :mod:`hpcrep.tensorflow.errors` adds the
subclasses that are also ``tf.errors`` types (Horovod raises ``FailedPreconditionError`` and
``InvalidArgumentError`` from its ops).

A message says what is wrong, what was expected, what was received, and how to fix it.
"""

from __future__ import annotations

from typing import Sequence


class HpcrepError(Exception):
    """Base class of every error raised by hpcrep."""


class NotInitializedError(HpcrepError, ValueError):
    """A function that needs MPI was called before :func:`hpcrep.comm.init`."""


class ConfigError(HpcrepError, ValueError):
    """An ``HPCREP_*`` setting has a value that cannot be used."""


class SettingsError(ConfigError):
    """``HPCREP_*`` variables of this process's environment cannot be used: a name that is no
    setting, a value that does not parse or is out of range, a directory that cannot be written.
    Found before MPI starts (:mod:`hpcrep.config_check`); ``problems`` holds one line for each,
    and the message lists them."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} hpcrep setting(s) cannot be used:\n"
                         + "\n".join(self.problems))


class CollectiveArgumentError(HpcrepError, ValueError):
    """A collective was called with arguments that are invalid on this rank (checked locally)."""


class CollectiveMismatchError(HpcrepError, ValueError):
    """Ranks passed different shapes, dtypes, counts or parameters to the same collective.

    Raised on every rank, with a message naming the tensor and what each rank passed.
    """


class CollectiveUnsupportedError(HpcrepError, NotImplementedError):
    """A collective was asked for a combination it does not implement (e.g. ``tf.IndexedSlices``
    with ``op=Max`` or with scale factors), as Horovod raises ``NotImplementedError`` there."""


class ReplicaDivergenceError(HpcrepError, RuntimeError):
    """The replica canary (``HPCREP_CHECK_REPLICAS_ACTION=abort``) found trainable or optimizer
    variables that differ across ranks. Raised on every rank, with the canary's report."""


class ExecutionModeError(HpcrepError, RuntimeError):
    """A function was called in an execution mode it does not support: a TF1 graph-mode helper
    (``broadcast_global_variables``) called eagerly, as Horovod raises ``RuntimeError`` there."""


class JoinError(HpcrepError, RuntimeError):
    """A collective ran while a rank waited in ``join()`` that cannot complete without it."""


class RemoteError(HpcrepError):
    """Another rank failed; this rank stops so that the job does not hang."""


class CheckpointError(HpcrepError):
    """A checkpoint cannot be written or restored (bad state, mismatched model, I/O failure)."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, unreadable, or fails its checksum."""


class CheckpointLockedError(CheckpointError):
    """Another job holds the checkpoint directory (one job per directory: two would delete each
    other's temporary files and mix their checkpoints)."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint or commit file is in a format hpcrep no longer reads (the pickled elastic
    commits of earlier versions, ``elastic-state-<id>.pkl``: loading a pickle runs code)."""


class UntrustedFileError(CheckpointError):
    """A file hpcrep would load (an elastic commit), or its directory, can be written by other
    users (group/other write permission) or belongs to another user: refused before it is read,
    for whoever can write there could make the job load what they chose."""


class NotPlainDataError(HpcrepError, TypeError):
    """An elastic state's attribute is not plain data (None, bool, int, float, str, lists,
    tuples, dicts, numpy scalars and arrays), so it cannot go into a commit on disk."""


class SlurmError(HpcrepError):
    """Slurm cannot do what was asked (no job to requeue, ``scontrol``/``sbatch`` failed)."""


class SlurmOptionError(SlurmError, ValueError):
    """A Slurm job option has an invalid value (checked before anything is submitted)."""


class DataError(HpcrepError, ValueError):
    """An input file or dataset option cannot be used (missing dataset, too few rows, bad shape)."""


class ReplicaContextError(HpcrepError, RuntimeError):
    """A replica-context primitive (all_reduce, all_gather, broadcast, cross-replica batch norm
    in training) was used outside a step function run by :meth:`hpcrep.replicator.Replicator.run`.
    """


class ShardedStateError(HpcrepError, ValueError):
    """Optimizer state cannot be sharded across ranks as asked (``shard_optimizer_state``): an
    optimizer or option whose result would differ from the unsharded optimizer's."""


class ReplicatorError(HpcrepError, ValueError):
    """A :class:`hpcrep.replicator.Replicator` was configured or used in a way it cannot honour."""


class TransparentModeError(HpcrepError, ValueError):
    """Transparent mode cannot run this script's training as written (e.g. too little data)."""


class OneSidedUnavailableError(HpcrepError, RuntimeError):
    """This MPI cannot create the one-sided (RMA) window a feature needs on this communicator."""


class ParamStoreUnavailableError(HpcrepError, RuntimeError):
    """The point-to-point parameter store cannot run in this process (it needs
    ``MPI_THREAD_MULTIPLE`` for its server thread)."""


class FaultToleranceUnavailableError(HpcrepError, RuntimeError):
    """Going on without a failed rank (:mod:`hpcrep.comm.ulfm`) needs an MPI with ULFM, started
    with fault tolerance on (Open MPI 5's ``mpirun --with-ft ulfm``), and this one has not."""


class HostsUpdatedInterrupt(HpcrepError, RuntimeError):
    """Raised by an elastic state's ``commit()`` on every rank when the job can grow back
    (:mod:`hpcrep.comm.grow`): ``@hvd.elastic.run`` adds the ranks and calls the function
    again, synced from rank 0 (Horovod's exception of the same name; ``skip_sync`` is always
    False). ``plan`` says where the new ranks go."""

    def __init__(self, plan: object = None, skip_sync: bool = False) -> None:
        super().__init__(f"the job can grow back: {plan}")
        self.plan = plan
        self.skip_sync = skip_sync


class LaunchOptionError(HpcrepError, ValueError):
    """``hpcrep run`` was given options it cannot launch with (bad host list or hostfile, more
    ranks than slots, an option whose feature is not built yet); checked before anything runs."""


class RankFailedError(HpcrepError, RuntimeError):
    """A rank of the job failed (died, or its node was lost) while this rank needed it, in a job
    whose MPI lets the survivors go on (ULFM: :mod:`hpcrep.comm.recovery`). Horovod's
    ``HorovodInternalError``: under ``@hvd.elastic.run`` the survivors shrink the job, return
    to the last commit and go on; elsewhere it ends the program like any exception."""


class GrowFailedError(HpcrepError, RuntimeError):
    """A rank failed while the job grew back (:func:`hpcrep.comm.grow.grow`, inside
    ``MPI_Comm_spawn``). The job cannot shrink there: the spawn's root waits for the spawned
    ranks, which wait for every parent, for good. So it ends (the rank that raises this aborts
    it), and ``hpcrep run --elastic`` relaunches it from the last commit."""
