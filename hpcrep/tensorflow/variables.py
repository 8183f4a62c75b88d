"""Making variables and Python objects equal on every rank."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import tensorflow as tf

from hpcrep import comm
from hpcrep.tensorflow.collectives import grouped_broadcast


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set: Any = None,
                        inplace: bool = False) -> Any:
    """Assign rank ``root_rank``'s values to ``variables`` on every rank (one fused exchange).

    Works eagerly and inside ``tf.function``; returns the grouped assign op.

    Collective: every rank must call this, in the same order, with the same variables.
    """
    variables = list(variables)
    if not variables:
        return tf.no_op()
    values = grouped_broadcast([v.value() if hasattr(v, "value") and callable(v.value)
                                else tf.convert_to_tensor(v) for v in variables], root_rank,
                               name="broadcast_variables", process_set=process_set)
    return tf.group(*[v.assign(x) for v, x in zip(variables, values)])


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None, process_set: Any = None) -> Any:
    """Return rank ``root_rank``'s Python object on every rank (pickled).

    Collective: every rank must call this, in the same order.
    """
    return comm.broadcast_object(obj, root_rank, process_set)


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: Any = None) -> list:
    """Return every rank's Python object, in rank order (pickled).

    Collective: every rank must call this, in the same order.
    """
    return comm.allgather_object(obj, process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: Any = None) -> Any:
    """Horovod compatibility: return a function that broadcasts its argument from ``root_rank``."""
    return lambda obj: broadcast_object(obj, root_rank, process_set=process_set)
