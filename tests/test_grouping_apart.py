"""grouping._apart (vectorised with numpy) answers as the loops it replaced did, kept
here as the reference: on random groups of GM transfers, with loops moving up or
down by whole lines or not, blocks a whole number of lines apart or not, and
enumerations either side of _DISJOINT_LINES (too many pieces in one access, too
many lines in one access, too many lines over several)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.engine.compile import GmCopy
from npusim.engine.grouping import _DISJOINT_LINES, _apart, gm_accesses
from npusim.isa.program import Affine


def reference_apart(group: list[tuple], step: int, members: int, line: int) -> bool:
    """grouping._apart as it was before it used numpy: every line of every piece into
    a set, then `members` shifted copies of it checked one by one."""
    lines: set = set()
    for *_, e, counts in group:
        a = e.gm_addr
        terms = [(var, s) for var, s in (a.terms if isinstance(a, Affine) else ()) if var != "block"]
        ranges = [range(counts.get(var, 1)) for var, _ in terms]
        if math.prod(len(r) for r in ranges) * e.segments > _DISJOINT_LINES:
            return False
        base = a.base if isinstance(a, Affine) else a
        for values in itertools.product(*ranges):
            start = base + sum(s * v for (_, s), v in zip(terms, values))
            for i in range(e.segments):
                first = start + i * e.stride
                lines.update(range(first // line, -(-(first + e.nbytes) // line)))
        if len(lines) > _DISJOINT_LINES:
            return False
    if step % line:
        return False
    touched: set = set()
    for m in range(members):
        shifted = {x + m * (step // line) for x in lines}
        if touched & shifted:
            return False
        touched |= shifted
    return True


LINES = st.sampled_from([128, 512])
LOOP_VARS = ["i", "j", "k"]
# steps of loops and blocks: whole lines (up or down), bursts, odd bytes, none
STEPS = st.one_of(st.sampled_from([0, 32, 128, 512, 4096, -128, -512, 65536]),
                  st.integers(-5000, 5000), st.integers(1, 64).map(lambda n: n * 128))
WHOLE = _DISJOINT_LINES * 128  # bytes in _DISJOINT_LINES lines of 128
# (loop counts, segments, nbytes) of a few pieces of a few lines, of about
# _DISJOINT_LINES pieces, and of a few pieces of about _DISJOINT_LINES lines (kept
# apart: the reference's loops would take minutes over many long pieces)
SIZES = {
    "small": (st.integers(0, 24), st.one_of(st.integers(1, 8), st.just(0)), st.integers(0, 3000)),
    "many pieces": (st.sampled_from([64, 128, 256, 257]), st.sampled_from([1, 2]), st.integers(0, 256)),
    "long pieces": (st.integers(0, 2), st.just(1), st.sampled_from([WHOLE // 2, WHOLE - 64, WHOLE, WHOLE + 1])),
}


def transfer(base: int, terms: tuple, nbytes: int, segments: int, stride: int, block_step: int) -> GmCopy:
    """A GM read of `segments` pieces of `nbytes`, `stride` apart, at base + terms
    (an int when no loop moves it), moving by `block_step` per block."""
    terms = terms + ((("block", block_step),) if block_step else ())
    gm_addr = Affine(base, terms) if terms else base
    return GmCopy(instr=None, startup=0, name="MTE2", write=False, cap=1.0, gm_addr=gm_addr, nbytes=nbytes,
                  segments=segments, stride=stride, local="L1", step=block_step)


@st.composite
def accesses(draw, block_step: int) -> tuple:
    """One access as gm_accesses gives it: up to 3 loops (counts in scope) moving it."""
    counts_of, segments_of, nbytes_of = SIZES[draw(st.sampled_from(sorted(SIZES)))]
    loop_vars = draw(st.lists(st.sampled_from(LOOP_VARS), max_size=3, unique=True))
    terms = tuple((var, draw(STEPS)) for var in loop_vars)
    counts = {var: draw(counts_of) for var in loop_vars + draw(st.lists(st.sampled_from(LOOP_VARS), max_size=1))}
    nbytes, segments = draw(nbytes_of), draw(segments_of)
    stride = draw(st.one_of(STEPS, st.just(nbytes)))
    e = transfer(draw(st.integers(0, 1 << 22)), terms, nbytes, segments, stride, block_step)
    return next(gm_accesses((e,), {"sub": 2, **counts}))


@st.composite
def groups(draw) -> tuple:
    """A group of accesses with one block step, the blocks sharing them, the line."""
    step = draw(STEPS)
    return draw(st.lists(accesses(step), min_size=1, max_size=4)), step, draw(st.integers(1, 40)), draw(LINES)


@settings(max_examples=400, deadline=None)
@given(groups())
def test_apart_answers_as_the_loops_did(case):
    group, step, members, line = case
    assert _apart(group, step, members, line) == reference_apart(group, step, members, line)


def one_access(base: int, terms: tuple, counts: dict, nbytes: int, segments: int = 1, stride: int = 0) -> tuple:
    return next(gm_accesses((transfer(base, terms, nbytes, segments, stride, 0),), counts))


# (group, block step, members, line, the answer): each at a limit of _DISJOINT_LINES,
# or on copies that meet only late, or on pieces of no bytes
EDGES = [
    ([one_access(0, (("i", 128),), {"i": 256}, 128, 256, 256 * 128)], 1 << 30, 2, 128, True),  # pieces == limit
    ([one_access(0, (("i", 128),), {"i": 257}, 128, 256, 256 * 128)], 1 << 30, 2, 128, False),  # pieces > limit
    ([one_access(0, (("i", 1),), {"i": _DISJOINT_LINES}, 1)], 1 << 30, 2, 128, True),  # pieces == limit, 1 loop
    ([one_access(0, (("i", 1),), {"i": _DISJOINT_LINES + 1}, 1)], 1 << 30, 2, 128, False),  # ... one more
    ([one_access(64, (), {}, WHOLE - 64)], WHOLE, 2, 128, True),  # lines == limit
    ([one_access(64, (), {}, WHOLE)], 2 * WHOLE, 2, 128, False),  # lines > limit
    ([one_access(0, (), {}, WHOLE // 2)] * 3, 1 << 30, 2, 128, True),  # one access's lines thrice
    ([one_access(0, (), {}, WHOLE // 2), one_access(1 << 30, (), {}, WHOLE // 2 + 128)], 1 << 31, 2, 128,
     False),  # lines > limit only over two accesses
    ([one_access(0, (("i", 128 * 39),), {"i": 2}, 128)], 128, 39, 128, True),  # copies 1..38 lines on miss
    ([one_access(0, (("i", 128 * 39),), {"i": 2}, 128)], 128, 40, 128, False),  # ... the 40th meets the first
    ([one_access(0, (("i", -128 * 39),), {"i": 2}, 128)], -128, 40, 128, False),  # down, as up
    ([one_access(0, (), {}, 0)], 0, 40, 128, True),  # no bytes at a line's start: no line
    ([one_access(5, (), {}, 0)], 0, 2, 128, False),  # no bytes within a line: that line
]


@pytest.mark.parametrize("group, step, members, line, answer", EDGES)
def test_apart_answers_as_the_loops_did_at_the_edges(group, step, members, line, answer):
    assert _apart(group, step, members, line) == reference_apart(group, step, members, line) == answer
