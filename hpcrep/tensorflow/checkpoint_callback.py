"""Checkpoint a Keras model with :mod:`hpcrep.checkpoint` (the public path; the implementation is
:mod:`hpcrep.tensorflow._keras.checkpoint_callback`).

``model.fit`` users add :class:`CheckpointCallback`; custom loops save
``training_state(model, optimizer)`` with a :class:`hpcrep.checkpoint.CheckpointManager` and put
it back with ``load_training_state(ckpt, model, optimizer)``.
"""

from hpcrep.tensorflow._keras.checkpoint_callback import (CheckpointCallback,
                                                          callback_from_settings,
                                                          load_training_state, set_tf_rng_state,
                                                          tf_rng_state, training_state)

__all__ = ["CheckpointCallback", "callback_from_settings", "training_state",
           "load_training_state", "tf_rng_state", "set_tf_rng_state"]
