"""The communication figures as TensorBoard scalars (hvd.callbacks.CommunicationTensorBoard):
rank 0 writes them into log_dir/hpcrep at each epoch's end, beside Keras's own runs, and
TensorBoard's own reader finds every figure for every step with the values the trace gives."""

import glob
import math
import os

import keras
import numpy as np
import pytest

import hpcrep.comm as hc
import hpcrep.tensorflow as hvd
from hpcrep.tensorflow.keras.callbacks import (BroadcastGlobalVariablesCallback,
                                               CommunicationTensorBoard)

STEPS_PER_EPOCH, EPOCHS = 3, 2


def _scalars(log_dir: str) -> dict:
    """Return {tag: [(step, value), ...]} of the run log_dir/hpcrep, read with TensorBoard."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(os.path.join(log_dir, "hpcrep"),
                                             size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        out[tag] = [(e.step, float(np.asarray(
            __import__("tensorflow").make_ndarray(e.tensor_proto)))) for e in acc.Tensors(tag)]
    return out


def test_scalars_for_every_step_beside_keras_tensorboard(shared_dir):
    hvd.init()
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    rng = np.random.default_rng(hc.rank())
    x = rng.normal(size=(4 * STEPS_PER_EPOCH, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    log_dir = os.path.join(shared_dir, "logs")
    callbacks = [BroadcastGlobalVariablesCallback(0),
                 CommunicationTensorBoard(log_dir)]
    if hc.rank() == 0:
        callbacks.append(keras.callbacks.TensorBoard(log_dir))
    model.fit(x, y, batch_size=4, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    hc.barrier()
    if hc.rank() != 0:
        return
    assert os.path.isdir(os.path.join(log_dir, "train"))  # Keras's own run, side by side
    assert glob.glob(os.path.join(log_dir, "hpcrep", "events.out.tfevents.*"))
    scalars = _scalars(log_dir)
    steps = list(range(STEPS_PER_EPOCH * EPOCHS))
    for tag in ("hpcrep/step_ms", "hpcrep/compute_ms", "hpcrep/exposed_communication_ms",
                "hpcrep/mpi_ms", "hpcrep/megabytes"):
        assert [s for s, _ in scalars[tag]] == steps, (tag, scalars[tag])
        assert all(math.isfinite(v) and v >= 0 for _, v in scalars[tag]), (tag, scalars[tag])
    assert all(v > 0 for _, v in scalars["hpcrep/step_ms"])
    grad_mb = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables) / 1e6
    pad_mb = 64 * len(model.trainable_variables) / 1e6  # fusion aligns each tensor to 64 B
    if hc.size() > 1:  # every step averages the gradients: their bytes, and a bandwidth
        for _, mb in scalars["hpcrep/megabytes"]:
            assert grad_mb <= mb <= grad_mb + pad_mb, (mb, grad_mb)
        assert [s for s, _ in scalars["hpcrep/bandwidth_gbps"]] == steps
        assert all(0 <= v <= 1 for _, v in scalars["hpcrep/overlap"])
        stragglers = [t for t in scalars if t.startswith("hpcrep/straggler_ms/rank_")]
        assert len(stragglers) == hc.size()
        for tag in stragglers:  # written once an epoch, at the epoch's last step
            assert [s for s, _ in scalars[tag]] == [STEPS_PER_EPOCH - 1, len(steps) - 1]
    print("hpcrep scalars (first 3 steps):",
          {t: [round(v, 3) for _, v in scalars[t][:3]] for t in sorted(scalars)
           if not t.startswith("hpcrep/straggler")})
