"""Tensor-parallel Keras 3 layers: weights split over the ranks of one replica.

With ``Replicator(ranks_per_replica=k)`` every rank of a replica runs the same ``step_fn`` on
the same batch. These layers keep 1/k of their big weight on each of those ranks and exchange
activations on the replica's ``model_parallel`` communicator (:mod:`hpcrep.comm.mesh`) so that
their outputs and gradients equal those of the unsharded layer:

- :class:`ColumnParallelDense`: kernel split along its outputs. The input passes unchanged (its
  gradient is summed over the replica); the output stays split, ready for a
  :class:`RowParallelDense`, or is gathered whole with ``gather_output=True``.
- :class:`RowParallelDense`: kernel split along its inputs. Each rank multiplies its slice of the
  input; the partial outputs are summed over the replica, and the bias (whole on every rank) is
  added once, after the sum.
- :class:`ShardedEmbedding`: the table's rows split over the replica (the first
  ``input_dim % k`` ranks hold one row more).

A Column -> Row pair (Megatron-LM's MLP) exchanges one allreduce forward and one backward. The
layers pick up the mesh of the ``Replicator.scope()`` (or ``step_fn``) they are created in, or
take ``mesh=`` (:func:`hpcrep.comm.mesh.split`) in the explicit API; without a mesh, or with one
rank per replica, they are plain layers and communicate nothing. Their weights are initialised as
the unsharded layer's (:mod:`hpcrep.replicator.sharded_init`), registered as sharded
(:mod:`hpcrep.tensorflow.sharded_variables`, so checkpoints hold them whole and restore them at
any k), and averaged by ``Replicator.wrap_optimizer`` over the ranks holding the same shard.

Each call is collective over the replica's ranks: all of them must call the layer, in the same
order, on inputs of the same shape. Compile steps without XLA (hpcrep's collectives run on the
host).
"""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from hpcrep.comm.mesh import Mesh
from hpcrep.errors import ReplicatorError
from hpcrep.replicator import context, shard_ops
from hpcrep.replicator.sharded_init import even_rows, slice_initializer
from hpcrep.tensorflow.sharded_variables import ShardSpec, mark_sharded


class _Sharded(keras.layers.Layer):
    """What the three layers share: the mesh, and adding a weight that holds one slice."""

    def __init__(self, mesh: Optional[Mesh] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mesh = mesh if mesh is not None else context.current_mesh()
        self.num_shards = self.mesh.num_shards if self.mesh is not None else 1
        self.shard_index = self.mesh.shard_index if self.mesh is not None else 0

    def _divisible(self, what: str, value: int) -> int:
        """``value // num_shards``, or a ReplicatorError saying what to change. Local."""
        k = self.num_shards
        if value % k:
            nearby = sorted({max(k, value - value % k), value - value % k + k})
            raise ReplicatorError(
                f"{type(self).__name__} {self.name!r}: {what}={value} must be a multiple of the "
                f"{k} ranks per replica it is split over; choose {what} among {nearby}, or "
                "ranks_per_replica dividing it.")
        return value // k

    def _add_slice(self, name: str, full_shape: tuple, axis: int, start: int, stop: int,
                   initializer: Any) -> Any:
        shape = list(full_shape)
        shape[axis] = stop - start
        variable = self.add_weight(
            name=name, shape=tuple(shape),
            initializer=slice_initializer(initializer, full_shape, axis, start, stop))
        if self.num_shards > 1:
            mark_sharded(variable, ShardSpec(axis, full_shape[axis], start, stop,
                                             self.mesh.model_parallel))
        return variable

    @property
    def _group(self) -> Any:
        return self.mesh.model_parallel


class ColumnParallelDense(_Sharded):
    """A Dense layer whose kernel ``(in, units)`` and bias are split along ``units``.

    Args:
        units: output width of the whole layer (a multiple of the ranks per replica).
        activation: applied to each rank's slice (elementwise, so as to the whole output).
        use_bias: add a bias (split like the outputs).
        kernel_initializer, bias_initializer: as ``keras.layers.Dense``; each rank draws the
            whole weight and keeps its slice, so the layer starts as the unsharded one.
        gather_output: return the whole ``units``-wide output on every rank (an allgather);
            False (default) returns this rank's ``units / k`` columns, for a
            :class:`RowParallelDense` with ``input_is_parallel=True``.
        mesh: the replicas x shards mesh; default: the one of the enclosing
            ``Replicator.scope()`` or ``step_fn`` (none: an ordinary Dense).

    Raises:
        ReplicatorError: ``units`` is not a multiple of the ranks per replica.
    """

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 gather_output: bool = False, mesh: Optional[Mesh] = None, **kwargs: Any) -> None:
        super().__init__(mesh=mesh, **kwargs)
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.gather_output = bool(gather_output)
        self.local_units = self._divisible("units", self.units)

    def build(self, input_shape: Any) -> None:
        start = self.shard_index * self.local_units
        stop = start + self.local_units
        self.kernel = self._add_slice("kernel", (int(input_shape[-1]), self.units), 1, start,
                                      stop, self.kernel_initializer)
        self.bias = (self._add_slice("bias", (self.units,), 0, start, stop,
                                     self.bias_initializer) if self.use_bias else None)

    def call(self, inputs: Any) -> Any:
        x = inputs
        if self.num_shards > 1:
            x = shard_ops.copy_to_shards(x, self._group, f"{self.name}.input")
        y = keras.ops.matmul(x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        y = self.activation(y) if self.activation is not None else y
        if self.gather_output and self.num_shards > 1:
            y = shard_ops.gather_from_shards(y, self._group, -1, f"{self.name}.output")
        return y

    def compute_output_shape(self, input_shape: Any) -> tuple:
        width = self.units if self.gather_output else self.local_units
        return (*tuple(input_shape)[:-1], width)

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units, "use_bias": self.use_bias,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "gather_output": self.gather_output}


class RowParallelDense(_Sharded):
    """A Dense layer whose kernel ``(in, units)`` is split along ``in``; the bias is whole.

    Args:
        units: output width (whole on every rank).
        activation: applied after the partial outputs are summed and the bias added.
        use_bias: add a bias, once, after the sum (replicated on every rank of the replica).
        kernel_initializer, bias_initializer: as ``keras.layers.Dense``; the kernel is drawn
            whole and sliced, as the unsharded layer's.
        input_is_parallel: the input is already this rank's ``in / k`` columns (the output of
            a :class:`ColumnParallelDense`, default); False: the input is whole and each rank
            takes its columns (the gradient is gathered back).
        mesh: as :class:`ColumnParallelDense`.

    Raises:
        ReplicatorError: with ``input_is_parallel=False``, an input width that is not a
            multiple of the ranks per replica.
    """

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 input_is_parallel: bool = True, mesh: Optional[Mesh] = None,
                 **kwargs: Any) -> None:
        super().__init__(mesh=mesh, **kwargs)
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.input_is_parallel = bool(input_is_parallel)

    def build(self, input_shape: Any) -> None:
        width = int(input_shape[-1])
        local = width if self.input_is_parallel else self._divisible("input width", width)
        start = self.shard_index * local
        self.kernel = self._add_slice("kernel", (local * self.num_shards, self.units), 0, start,
                                      start + local, self.kernel_initializer)
        self.bias = (self.add_weight(name="bias", shape=(self.units,),
                                     initializer=self.bias_initializer)
                     if self.use_bias else None)

    def call(self, inputs: Any) -> Any:
        x = inputs
        if not self.input_is_parallel and self.num_shards > 1:
            x = shard_ops.scatter_to_shards(x, self._group, -1, f"{self.name}.input")
        y = keras.ops.matmul(x, self.kernel)
        if self.num_shards > 1:
            y = shard_ops.reduce_from_shards(y, self._group, f"{self.name}.output")
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y) if self.activation is not None else y

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*tuple(input_shape)[:-1], self.units)

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units, "use_bias": self.use_bias,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "input_is_parallel": self.input_is_parallel}


class ShardedEmbedding(_Sharded):
    """An Embedding whose table's rows are split over the replica's ranks.

    Lookup: a masked local lookup plus one allreduce. Every rank of a replica has the same ids
    (the same batch), so each looks up the ids that fall in its rows, writes zeros for the
    others, and the sum over the replica (:func:`~hpcrep.replicator.shard_ops.
    reduce_from_shards`) is the whole lookup: one ``batch x output_dim`` allreduce, no exchange
    of ids. An allgather would move the table (what sharding avoids); an alltoall routes ids to
    the rank owning them, which pays off when the ranks hold *different* ids, not here. The
    table's gradient stays this rank's rows (``tf.IndexedSlices``; rows of other shards get
    zeros at local row 0).

    Args:
        input_dim: rows of the whole table (at least the ranks per replica; need not divide).
        output_dim: width of an embedding.
        embeddings_initializer: as ``keras.layers.Embedding`` (default ``"uniform"``): the whole
            table is drawn and sliced, or with a
            :class:`~hpcrep.replicator.sharded_init.RowBlockInitializer` only this rank's rows.
        mesh: as :class:`ColumnParallelDense`.

    Raises:
        ReplicatorError: fewer rows than ranks per replica.
    """

    def __init__(self, input_dim: int, output_dim: int,
                 embeddings_initializer: Any = "uniform", mesh: Optional[Mesh] = None,
                 **kwargs: Any) -> None:
        super().__init__(mesh=mesh, **kwargs)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        if self.input_dim < self.num_shards:
            raise ReplicatorError(
                f"ShardedEmbedding {self.name!r}: input_dim={self.input_dim} rows cannot be "
                f"split over {self.num_shards} ranks per replica; use a table of at least "
                f"{self.num_shards} rows or fewer ranks per replica")
        self.row_start, self.row_stop = even_rows(self.input_dim, self.num_shards,
                                                  self.shard_index)

    def build(self, input_shape: Any = None) -> None:
        self.embeddings = self._add_slice("embeddings", (self.input_dim, self.output_dim), 0,
                                          self.row_start, self.row_stop,
                                          self.embeddings_initializer)

    def call(self, inputs: Any) -> Any:
        ids = tf.cast(inputs, tf.int32) if inputs.dtype not in (tf.int32, tf.int64) else inputs
        if self.num_shards == 1:
            return tf.gather(self.embeddings, ids)
        local = ids - tf.cast(self.row_start, ids.dtype)
        inside = tf.logical_and(local >= 0, local < self.row_stop - self.row_start)
        rows = tf.gather(self.embeddings, tf.where(inside, local, tf.zeros_like(local)))
        rows = rows * tf.cast(inside, rows.dtype)[..., None]
        return shard_ops.reduce_from_shards(rows, self._group, f"{self.name}.lookup")

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*tuple(input_shape), self.output_dim)

    def get_config(self) -> dict:
        return {**super().get_config(), "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer)}
