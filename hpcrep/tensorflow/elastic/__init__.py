"""Horovod's elastic API (``hvd.elastic``) as far as hpcrep can honour it without a driver.

What works as in Horovod: state objects (:class:`ObjectState`, :class:`TensorFlowState`,
:class:`TensorFlowKerasState`) whose ``commit()`` snapshots the state in memory, ``restore()``
returns to the last snapshot, and ``sync()`` gives every rank rank 0's state (and snapshots it);
``@hvd.elastic.run`` syncs the state and calls the training function; reset callbacks register.

What does not, because hpcrep has no elastic driver and MPI cannot shrink a running job: ranks
are never added or removed while a job runs, so ``HostsUpdatedInterrupt`` never happens and reset
callbacks never fire; a rank that fails ends the whole job (``hpcrep run`` aborts every rank, no
hang), and ``run`` does not retry in-process. What replaces the retry is restart-from-commit:
with ``HPCREP_ELASTIC_DIR`` set, rank 0 also writes every commit there, and the first ``sync`` of
a relaunched job (``hpcrep run`` again, or a Slurm requeue; any number of ranks) resumes every rank
from that commit; ``hpcrep run --elastic`` relaunches by itself on the hosts still reachable
(:mod:`hpcrep.launch.relaunch`). Keras states resume weights only into a built model (give it
an ``Input``). Scripts written for Horovod elastic run unchanged, as fixed-size jobs.
"""

from hpcrep.tensorflow._keras.elastic import TensorFlowKerasState
from hpcrep.tensorflow.elastic.state import ObjectState, State, TensorFlowState, run

__all__ = ["State", "ObjectState", "TensorFlowState", "TensorFlowKerasState", "run"]
