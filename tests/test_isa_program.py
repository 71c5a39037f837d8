"""The instruction records' own helpers (npusim.isa.program)."""

from __future__ import annotations

import attrs
import pytest

from npusim.isa.program import Copy, VecOp

# moved(...) builds the record directly; it must give what attrs.evolve gives, for
# every field, including any field added to the record later.
MOVED = [(Copy, ("src_addr", "dst_addr")), (VecOp, ("dst", "srcs"))]


@pytest.mark.parametrize(("cls", "changed"), MOVED, ids=[c.__name__ for c, _ in MOVED])
def test_moved_is_evolve_on_every_field(cls, changed):
    # a distinct value in every field, so a field moved() drops or misplaces shows
    original = cls(*[f"value of {f.name}" for f in attrs.fields(cls)])
    new = ("first new address", "second new address")
    moved = original.moved(*new)
    assert moved == attrs.evolve(original, **dict(zip(changed, new)))
    assert [getattr(moved, f.name) for f in attrs.fields(cls)] == [
        dict(zip(changed, new)).get(f.name, f"value of {f.name}") for f in attrs.fields(cls)]
