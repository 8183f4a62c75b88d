"""Tensor-parallel arguments checked without MPI: how ranks form replicas, how rows split,
what a bad ranks_per_replica or layer width says, and block-wise initialisation."""

import numpy as np
import pytest

from hpcrep.comm.mesh import Mesh, layout_problem
from hpcrep.errors import ReplicatorError
from hpcrep.replicator import (ColumnParallelDense, RowBlockInitializer, RowParallelDense,
                               ShardedEmbedding)
from hpcrep.replicator.sharded_init import even_rows


def test_ranks_per_replica_must_divide_the_job():
    assert layout_problem(4, 1) == layout_problem(4, 2) == layout_problem(4, 4) == ""
    message = layout_problem(4, 3)
    assert "ranks_per_replica=3 must divide the number of ranks, but the job has 4" in message
    assert "mpirun -n 3 or mpirun -n 6" in message and "among [1, 2, 4]" in message
    assert "mpirun -n 2)" in layout_problem(1, 2)
    assert "must be >= 1, got 0" in layout_problem(4, 0)
    for bad in ("2", 2.0, True, None):
        assert "must be a positive integer" in layout_problem(4, bad)


def test_rows_split_evenly_first_shards_longer():
    assert [even_rows(10, 4, s) for s in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [even_rows(10, 2, s) for s in range(2)] == [(0, 5), (5, 10)]
    assert even_rows(7, 1, 0) == (0, 7)


def two_shards(shard_index=0):
    """A mesh of 2 ranks per replica as a layer sees it at construction, which only reads its
    sizes (communicators are used when the layer is called)."""
    return Mesh(2, 0, 1, shard_index, model_parallel=None, data_parallel=None, parent=None)


def test_layer_widths_must_split_over_the_replica():
    with pytest.raises(ReplicatorError, match=r"ColumnParallelDense 'c': units=5 must be a "
                                              r"multiple of the 2 ranks.*among \[4, 6\]"):
        ColumnParallelDense(5, mesh=two_shards(), name="c")
    layer = RowParallelDense(3, input_is_parallel=False, mesh=two_shards(), name="r")
    with pytest.raises(ReplicatorError, match="input width=5 must be a multiple of the 2 ranks"):
        layer.build((None, 5))
    with pytest.raises(ReplicatorError, match="input_dim=1 rows cannot be split over 2 ranks"):
        ShardedEmbedding(1, 4, mesh=two_shards())
    assert ColumnParallelDense(6, mesh=two_shards(1)).local_units == 3
    embedding = ShardedEmbedding(5, 2, mesh=two_shards(1))
    assert (embedding.row_start, embedding.row_stop) == (3, 5)


def test_row_blocks_do_not_depend_on_the_split():
    init = RowBlockInitializer("uniform", block_rows=4, seed=7)
    table = init((10, 3)).numpy()
    assert table.shape == (10, 3) and np.unique(table).size == 30
    parts = [init.rows(a, b, (3,)).numpy() for a, b in ((0, 3), (3, 9), (9, 10))]
    np.testing.assert_array_equal(np.concatenate(parts), table)
    np.testing.assert_array_equal(init((13, 3)).numpy()[:10], table)  # a longer table extends it
    other_seed = RowBlockInitializer("uniform", block_rows=4, seed=8)((10, 3)).numpy()
    assert not np.array_equal(other_seed, table)
    with pytest.raises(ReplicatorError, match="block_rows must be >= 1"):
        RowBlockInitializer(block_rows=0)
    with pytest.raises(ReplicatorError, match="takes no seed"):
        RowBlockInitializer("identity")
