"""``python -m hpcrep script.py [args]``: run a single-process script data-parallel, unchanged.

Start it on every rank (``mpirun -n 4 python -m hpcrep train.py``, ``srun``, or
``hpcrep run -n 4 train.py``). The script runs as ``python script.py`` would, inside
:func:`hpcrep.tensorflow.transparent`; ``python -m hpcrep -m package.module [args]`` runs a module.
``python -m hpcrep --no-transparent script.py`` runs a script that distributes its own training
(``hpcrep.tensorflow`` or Horovod's API) without transparent mode, with ``horovod.*`` mapped to
hpcrep's modules where Horovod is not installed (:mod:`hpcrep.tensorflow.horovod_alias`);
``hpcrep run`` chooses between the two by reading the script. ``python -m hpcrep --elastic
script.py`` keeps ``fit`` going on the survivors of a failed rank where the MPI allows it
(``HPCREP_TRANSPARENT_ELASTIC``, :mod:`hpcrep.tensorflow.transparent.elastic_fit`).
The files and directories an unchanged script makes itself end up as one process's would
(:mod:`hpcrep.tensorflow.transparent.own_files`). An unhandled exception on any rank aborts every
rank (see :mod:`hpcrep.launch.runner`). Before anything else each rank checks its ``HPCREP_*``
settings (:mod:`hpcrep.config_check`): a misspelt name, a bad value or an unwritable directory is
one ``hpcrep: `` line on stderr and exit status 2, before MPI and TensorFlow start.
"""

from __future__ import annotations

import functools
import sys
from typing import ContextManager, Sequence

EXPLICIT_FLAG = "--no-transparent"
ELASTIC_FLAG = "--elastic"


def _transparent(target: Sequence[str]) -> ContextManager:
    from hpcrep.launch.runner import script_file  # noqa: PLC0415
    from hpcrep.launch.script_api import script_knows_rank  # noqa: PLC0415
    from hpcrep.tensorflow.transparent import transparent  # noqa: PLC0415 - imports TensorFlow

    script = script_file(target)  # a script that knows its rank looks after its own files:
    return transparent(script=None if script is None or script_knows_rank(script) else script)


def _explicit() -> ContextManager:
    from hpcrep.tensorflow.horovod_alias import horovod_alias  # noqa: PLC0415

    return horovod_alias()


if __name__ == "__main__":
    import os

    from hpcrep.config_check import exit_on_problems

    # every HPCREP_* setting, before MPI and TensorFlow start: one line per problem, exit 2
    exit_on_problems()
    from hpcrep.launch.tf_log import set_tf_log_level

    set_tf_log_level(os.environ)  # before the script imports TensorFlow (HPCREP_TF_LOG)
    from hpcrep.launch.runner import main

    argv = sys.argv[1:]
    if argv[:1] == [ELASTIC_FLAG]:  # before the settings are read (transparent() reads them)
        os.environ["HPCREP_TRANSPARENT_ELASTIC"] = "1"
        argv = argv[1:]
    explicit = argv[:1] == [EXPLICIT_FLAG]
    sys.exit(main(argv[1:] if explicit else argv,
                  context=_explicit if explicit else functools.partial(_transparent, argv)))
