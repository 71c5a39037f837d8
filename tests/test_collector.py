"""npusim.collector: the garbage collector runs rarely within the block, and is as
it was after it (also when the block raises)."""

from __future__ import annotations

import gc

import pytest

from npusim.collector import YOUNG_ALLOCATIONS, fewer_collections


def test_fewer_collections_raises_the_young_threshold_and_restores_it():
    before = gc.get_threshold()
    with pytest.raises(KeyError):
        with fewer_collections():
            assert gc.get_threshold() == (max(before[0], YOUNG_ALLOCATIONS), *before[1:])
            raise KeyError("inside")
    assert gc.get_threshold() == before


def test_a_collector_turned_off_stays_off():
    before = gc.get_threshold()
    gc.set_threshold(0, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
