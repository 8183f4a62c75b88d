"""The Keras-facing implementation lives in hpcrep.tensorflow._keras; the public paths that
Horovod users and the README name are thin faces over it, and transparent mode uses the
implementation, not the Horovod face (whose __init__ star-imports all of hpcrep.tensorflow)."""

import ast
from pathlib import Path

import hpcrep.tensorflow as hvd
import hpcrep.tensorflow.checkpoint_callback as checkpoint_face
import hpcrep.tensorflow.keras as hvdk
from hpcrep.tensorflow._keras import (backup_and_restore, callbacks, checkpoint_callback,
                                      elastic)
from hpcrep.tensorflow.elastic import state

TRANSPARENT = Path(hvd.__file__).resolve().parent / "transparent"


def test_horovod_keras_names_are_the_implementation():
    assert hvdk.callbacks.BroadcastGlobalVariablesCallback is \
        callbacks.BroadcastGlobalVariablesCallback
    assert hvdk.callbacks.MetricAverageCallback is callbacks.MetricAverageCallback
    assert hvdk.callbacks.LearningRateScheduleCallback is callbacks.LearningRateScheduleCallback
    assert hvdk.callbacks.LearningRateWarmupCallback is callbacks.LearningRateWarmupCallback
    assert hvdk.callbacks.BackupAndRestore is backup_and_restore.BackupAndRestore
    assert hvdk.DistributedOptimizer is hvd.DistributedOptimizer
    assert hvdk.init is hvd.init and hvdk.allreduce is hvd.allreduce


def test_keras_face_has_the_keras_elastic_and_the_tensorflow_face_the_generic_one():
    # The star import binds hpcrep.tensorflow.elastic in the Keras face first; the face must
    # replace it with its own (a plain ``from ... import elastic`` would keep the wrong one).
    assert hvdk.elastic is not hvd.elastic
    assert hvdk.elastic.KerasState is elastic.KerasState
    for name in ("CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"):
        assert getattr(hvdk.elastic, name) is getattr(elastic, name)
    assert hvdk.elastic.run is hvd.elastic.run is state.run
    assert hvd.elastic.TensorFlowKerasState is elastic.TensorFlowKerasState
    assert hvd.elastic.ObjectState is state.ObjectState
    assert not hasattr(hvd.elastic, "KerasState")


def test_documented_checkpoint_path_re_exports():
    for name in checkpoint_face.__all__:
        assert getattr(checkpoint_face, name) is getattr(checkpoint_callback, name)


def test_transparent_mode_never_imports_the_horovod_face():
    found = {}
    for path in sorted(TRANSPARENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name == "hpcrep.tensorflow.keras" or name.startswith("hpcrep.tensorflow.keras."):
                    found[path.name] = name
    assert not found, f"transparent mode imports the Horovod face: {found}; import _keras"
