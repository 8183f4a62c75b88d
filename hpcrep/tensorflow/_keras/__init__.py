"""Keras-facing implementation, private (Horovod's ``_keras`` pattern).

The public faces are thin and only re-export from here: :mod:`hpcrep.tensorflow.keras` (Horovod's
``import horovod.tensorflow.keras as hvd``: ``hvd.callbacks``, ``hvd.elastic``),
:mod:`hpcrep.tensorflow.elastic` and :mod:`hpcrep.tensorflow.checkpoint_callback`. Transparent
mode (:mod:`hpcrep.tensorflow.transparent`) imports these modules directly, not the faces.

- :mod:`.callbacks`: weights broadcast at the start, epoch logs averaged, learning-rate schedule
  and warm-up;
- :mod:`.backup_and_restore`: Keras's ``BackupAndRestore`` with rank 0 reading and writing;
- :mod:`.checkpoint_callback`: training state to and from :mod:`hpcrep.checkpoint`, and a callback;
- :mod:`.lr_scale`: learning rates scaled by the number of ranks, kept out of saved files;
- :mod:`.elastic`: the elastic state of a Keras model and its callbacks;
- :mod:`.load_model`: a saved model with its optimizer wrapped again (``hvd.load_model``).
"""
