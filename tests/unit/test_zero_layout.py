"""The flat layout of sharded optimizer state: every element of every variable belongs to
exactly one rank's slice, in order, slices are equal, and only the end is padded."""

from __future__ import annotations

import pytest

from hpcrep.tensorflow.zero_layout import FlatLayout

SHAPES = [((5, 8), (8,), (8, 3), (3,)), ((7,),), ((2, 2),), ((1,), (1,), (1,))]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_slices_cover_every_element_once_in_order(shapes, size):
    layouts = [FlatLayout(shapes, size, r) for r in range(size)]
    total = layouts[0].total
    assert {lay.shard for lay in layouts} == {-(-total // size)}
    owned = []  # (variable, element) in the order the slices hold them
    for lay in layouts:
        mine = [(i, e) for i, a, b in lay.pieces() for e in range(a, b)]
        assert len(mine) + lay.padding == lay.shard
        owned += mine
    assert owned == [(i, e) for i, s in enumerate(shapes)
                     for e in range(layouts[0].counts[i])]
    assert sum(lay.padding for lay in layouts) == layouts[0].padded - total < size


def test_offsets_and_counts():
    lay = FlatLayout(((5, 8), (8,), (8, 3), (3,)), 4, 3)
    assert lay.counts == (40, 8, 24, 3) and lay.offsets == (0, 40, 48, 72)
    assert (lay.total, lay.shard, lay.start, lay.stop, lay.padding) == (75, 19, 57, 76, 1)
    assert lay.pieces() == [(2, 9, 24), (3, 0, 3)]
