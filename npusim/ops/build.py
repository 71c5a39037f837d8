"""Small helpers every lowering uses: local buffer allocation, ping-pong loops,
splitting work over cores."""

from __future__ import annotations

import math
from collections.abc import Callable

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import ALIGN_BYTES, Buffer, Loop, Mem


# the config field (section, name) of each local memory's size
_CAPACITY = {
    Mem.L1: ("aic", "l1_bytes"), Mem.L0A: ("aic", "l0a_bytes"), Mem.L0B: ("aic", "l0b_bytes"),
    Mem.L0C: ("aic", "l0c_bytes"), Mem.BT: ("aic", "bt_bytes"), Mem.FB: ("aic", "fb_bytes"), Mem.UB: ("aiv", "ub_bytes"),
}


def capacity(hw: HwConfig, mem: Mem) -> int:
    """The size of local memory `mem` (reads that one field: a cached step is keyed on the fields it read)."""
    section, name = _CAPACITY[mem]
    return getattr(getattr(hw, section), name)


def capacity_text(hw: HwConfig, mem: Mem) -> str:
    """`mem` and its size for a message, with the config key that sets it: UB (4096 bytes, aiv.ub_bytes)."""
    section, name = _CAPACITY[mem]
    return f"{mem.value} ({capacity(hw, mem)} bytes, {section}.{name})"


def align_up(n: int, a: int) -> int:
    return -(-n // a) * a


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gm_copy_cycles(hw: HwConfig, seg_bytes: float, segments: int, rate: float, cube: bool = False,
                   off_line: float = 0.0) -> float:
    """A tiling chooser's estimate of one GM copy as the engine times it: the DMA
    start-up, then the bytes at `rate` (bytes per cycle) or one segment per segment
    time of the core's DMA (a vector core's, or with `cube` a cube core's), whichever
    is slower, slowed as the engine slows a copy whose `off_line` share of segments
    start off an L2 line (Dma.off_line_scale)."""
    moving = max(segments * hw.dma.segment_cycles_of(cube), seg_bytes * segments / rate)
    return hw.dma.startup_cycles + moving / hw.dma.off_line_scale(math.ceil(seg_bytes), off_line)


def line_quantum(hw: HwConfig, *item_bytes: int) -> int:
    """The fewest items (rows, units) whose bytes fill whole L2 lines in every one of
    the given item sizes: a core's run of rows in multiples of this starts on a line,
    so no line is shared between cores."""
    line = hw.l2.line_bytes
    return math.lcm(*(line // math.gcd(n, line) for n in item_bytes))


class Buffers:
    """Bump allocator of one core's local buffers (Ascend C's pipe.InitBuffer).
    A tiling that does not fit stops with the buffer, bytes needed and available."""

    def __init__(self, hw: HwConfig, op: str):
        self.hw = hw
        self.op = op
        self.next: dict[Mem, int] = {}
        self.buffers: list[Buffer] = []

    def alloc(self, name: str, mem: Mem, nbytes: int) -> int:
        start = align_up(self.next.get(mem, 0), ALIGN_BYTES[mem])
        end = start + align_up(max(nbytes, 1), ALIGN_BYTES[mem])
        have = capacity(self.hw, mem)
        if end > have:
            raise ProgramError(
                f"op {self.op}: tiling does not fit {mem.value}: buffer '{name}' needs {end - start} bytes "
                f"at {start}, {end} in all; {capacity_text(self.hw, mem)}")
        self.next[mem] = end
        self.buffers.append(Buffer(name, mem, start, end - start))
        return start


def pingpong(var: str, count: int, make: Callable[[int, int], list]) -> list:
    """`count` iterations j = 0..count-1 alternating buffers ping (0) and pong (1):
    make(p, j_offset) builds iteration 2*var + j_offset with buffer p; the loop body
    holds a ping and a pong, and an odd count ends with one more ping (in a loop of
    one, so `var` is in scope there too, as 0)."""
    out: list = []
    if count >= 2:
        out.append(Loop(var, count // 2, make(0, 0) + make(1, 1)))
    if count % 2:
        out.append(Loop(var, 1, make(0, count - 1)))
    return out


def boxes(t0: int, t1: int, dims: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Decompose the linear range [t0, t1) of a row-major grid `dims` into boxes
    (start index, extent per dim), so each box is a plain loop nest."""
    if t0 >= t1:
        return []
    if len(dims) == 1:
        return [((t0,), (t1 - t0,))]
    inner = 1
    for d in dims[1:]:
        inner *= d
    out = []
    first, last = t0 // inner, (t1 - 1) // inner
    if first == last:
        return [((first,) + s, (1,) + e) for s, e in boxes(t0 - first * inner, t1 - first * inner, dims[1:])]
    if t0 % inner:  # partial leading slab
        out += [((first,) + s, (1,) + e) for s, e in boxes(t0 - first * inner, inner, dims[1:])]
        first += 1
    full_end = t1 // inner
    if full_end > first:  # whole slabs
        out.append(((first,) + (0,) * (len(dims) - 1), (full_end - first,) + dims[1:]))
    if t1 % inner:  # partial trailing slab
        out += [((full_end,) + s, (1,) + e) for s, e in boxes(0, t1 - full_end * inner, dims[1:])]
    return out
