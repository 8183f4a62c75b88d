"""The averaged logs of a ``fit``'s epochs, kept in its checkpoints as plain JSON, and the Keras
``History`` a rerun of a finished ``fit`` returns from them.

A checkpoint's ``epoch_logs`` attribute is ``{"<epoch>": {"<metric>": <float>, ...}, ...}``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

import keras
import numpy as np

from hpcrep.checkpoint import Checkpoint

log = logging.getLogger("hpcrep.checkpoint")


def plain(logs: Optional[dict]) -> dict[str, float]:
    """An epoch's logs as plain floats (what JSON holds); values that are not numbers dropped.
    Local."""
    found = {}
    for name, value in (logs or {}).items():
        try:
            found[str(name)] = float(np.asarray(value))
        except (TypeError, ValueError):
            continue
    return found


def dumps(epoch_logs: dict[int, dict[str, float]], before: int) -> str:
    """The JSON of the logs of the epochs before ``before``. Local."""
    return json.dumps({str(e): v for e, v in sorted(epoch_logs.items()) if e < before})


def read(ckpt: Checkpoint) -> dict[int, dict[str, float]]:
    """The epoch logs of the epochs ``ckpt`` has done (none for one saved without them). Local."""
    try:
        saved = json.loads(str(ckpt.attrs.get("epoch_logs", "{}")))
        return {int(e): {str(k): float(v) for k, v in logs.items()}
                for e, logs in saved.items() if int(e) < ckpt.epoch}
    except (ValueError, TypeError, AttributeError):
        log.warning("%s: its epoch logs are unreadable; the History starts empty", ckpt.path)
        return {}


def history(model: Any, epoch_logs: dict[int, dict[str, float]],
            epochs: int) -> keras.callbacks.History:
    """Return a Keras History of the logged epochs before ``epochs`` and make it
    ``model.history``. Local."""
    made = keras.callbacks.History()
    made.set_model(model)
    made.epoch = [e for e in sorted(epoch_logs) if e < epochs]
    for e in made.epoch:
        for name, value in epoch_logs[e].items():
            made.history.setdefault(name, []).append(value)
    model.history = made
    return made
