"""``python -m hpcrep script.py [args]``: run a single-process script data-parallel, unchanged.

Start it on every rank (``mpirun -n 4 python -m hpcrep train.py``, ``srun``, or
``hpcrep run -n 4 train.py``). The script runs as ``python script.py`` would, inside
:func:`hpcrep.tensorflow.transparent`; ``python -m hpcrep -m package.module [args]`` runs a module.
An unhandled exception on any rank aborts every rank (see :mod:`hpcrep.launch.runner`).
"""

from __future__ import annotations

import sys
from typing import ContextManager


def _transparent() -> ContextManager:
    from hpcrep.tensorflow.transparent import transparent  # noqa: PLC0415 - imports TensorFlow

    return transparent()


if __name__ == "__main__":
    import os

    from hpcrep.launch.tf_log import set_tf_log_level

    set_tf_log_level(os.environ)  # before the script imports TensorFlow (HPCREP_TF_LOG)
    from hpcrep.launch.runner import main

    sys.exit(main(sys.argv[1:], context=_transparent))
