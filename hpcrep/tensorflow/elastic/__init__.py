"""Horovod's elastic API (``hvd.elastic``): state objects and ``run``.

State objects (:class:`ObjectState`, :class:`TensorFlowState`, :class:`TensorFlowKerasState`)
work as in Horovod: ``commit()`` snapshots the state in memory, ``restore()`` returns to the
last snapshot, and ``sync()`` gives every rank rank 0's state (and snapshots it).

Where the MPI has ULFM and the job runs with fault tolerance on (Open MPI 5's
``mpirun --with-ft ulfm``; :mod:`hpcrep.comm.recovery`), ``@hvd.elastic.run`` goes on after a
rank fails, in the same processes: the survivors restore their last commit, the job shrinks to
them (``rank()``/``size()`` change; traced functions follow), the reset callbacks run, the state
is synced from the new rank 0 and the function runs again. With ``HPCREP_ELASTIC_MAX_NP``
(``hpcrep run --elastic --max-np``) the job grows back at a commit when the lost ranks' slots
are free again: ``commit()`` raises :class:`~hpcrep.errors.HostsUpdatedInterrupt`, new ranks
running the same program are spawned (:mod:`hpcrep.comm.grow`) and the function runs again
after a sync that gives them the state.

Without ULFM a rank that fails ends the whole job (no hang) and ``run`` does not retry
in-process. What replaces the retry is restart-from-commit: with ``HPCREP_ELASTIC_DIR`` set,
rank 0 also writes every commit there, and the first ``sync`` of a relaunched job (``hpcrep run``
again, or a Slurm requeue; any number of ranks) resumes every rank from that commit;
``hpcrep run --elastic`` relaunches by itself on the hosts still reachable
(:mod:`hpcrep.launch.relaunch`). Keras states resume weights only into a built model (give it
an ``Input``). Scripts written for Horovod elastic run unchanged.
"""

from hpcrep.tensorflow._keras.elastic import TensorFlowKerasState
from hpcrep.tensorflow.elastic.state import ObjectState, State, TensorFlowState, run

__all__ = ["State", "ObjectState", "TensorFlowState", "TensorFlowKerasState", "run"]
