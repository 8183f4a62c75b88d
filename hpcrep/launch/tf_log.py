"""TensorFlow's log level for the processes hpcrep starts (``HPCREP_TF_LOG``).

TensorFlow's C++ runtime prints INFO and WARNING lines on every rank when it loads
(``cpu_feature_guard.cc``'s "This TensorFlow binary is optimized to use available CPU
instructions...", absl's "WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR", the oneDNN notice on CPUs that have it). It reads ``TF_CPP_MIN_LOG_LEVEL``
once, when the library loads, so the level must be in a process's environment before that
process imports TensorFlow: hpcrep puts it there where it starts processes (the ``hpcrep``
command, :func:`hpcrep.launch.mpirun.mpirun_env`) and at the top of ``python -m hpcrep``, before
anything imports TensorFlow. This module never imports TensorFlow itself.

``TF_CPP_MIN_LOG_LEVEL`` already in the environment always wins: it is the user's (or an outer
launcher's) explicit choice. Nothing here changes numerics: ``TF_ENABLE_ONEDNN_OPTS`` is left
alone.
"""

from __future__ import annotations

from typing import MutableMapping

from hpcrep import config

LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET = "2"  # INFO and WARNING hidden; ERROR and FATAL still printed
ALL = "0"  # everything, set explicitly so that a launcher's own default (3) does not hide it


def tf_log_level() -> str:
    """Return the ``TF_CPP_MIN_LOG_LEVEL`` that ``HPCREP_TF_LOG`` asks for. Local.

    Raises:
        ConfigError: ``HPCREP_TF_LOG`` is neither ``quiet`` nor ``all``.
    """
    return QUIET if config.get("HPCREP_TF_LOG") == "quiet" else ALL


def set_tf_log_level(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Put :func:`tf_log_level` into ``env`` unless it already holds ``TF_CPP_MIN_LOG_LEVEL``.

    Returns ``env`` (changed in place). Call it on the environment of a process before that
    process imports TensorFlow (``os.environ`` at the top of a program, or a child's
    environment). Local.
    """
    env.setdefault(LEVEL, tf_log_level())
    return env
