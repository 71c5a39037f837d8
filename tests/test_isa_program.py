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


def test_records_pickle_as_their_fields_and_keep_shared_programs_shared():
    import pickle

    from npusim.isa.program import Affine, CoreType, Kernel, Loop, Mem, Program, Scalar, SyncAll

    body = [Loop("i", 3, [Copy(Mem.GM, Mem.L1, Affine(0x1000, (("i", 64),)), 0, 64, 2, None, 128), Scalar(2)]),
            SyncAll(), VecOp("add", 128, srcs=(0, 256))]
    shared = Program(body)
    kernel = Kernel("k", CoreType.AIC, 2, aic=(shared, shared))
    back = pickle.loads(pickle.dumps(kernel, pickle.HIGHEST_PROTOCOL))
    assert back == kernel and back.aic[0] is back.aic[1]
    assert back.blocks_running(CoreType.AIC, back.aic[0]) == 2
