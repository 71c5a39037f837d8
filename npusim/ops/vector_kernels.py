"""The streaming vector kernel every AIV operator is built from.

Work is a sequence of `rows` units (a row of a norm, or one element of an
elementwise op), split over the AIV cores in equal contiguous runs (a multiple of
`quantum` rows, so each core's data starts on an L2 line). A core walks its run in
tiles that fit UB twice over (ping and pong): MTE2 loads a tile of every input,
V computes it, MTE3 stores every output, and flags let the three overlap. Blocks
with the same run length share one Program (addresses move with `block`), which
the engine can simulate once for all of them.

Kernels that do not stream rows (a layout change, a gather, a cache write) list
their tiles instead: `tile_pipeline` runs them with the same double buffering and
`compress` / `share_blocks` fold regular runs back into loops and shared programs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Copy, CoreType, GmTensor, Kernel, Loop, Mem, Pipe, Program, SetFlag, VecOp, WaitFlag,
    addr, moving, set_flag, shift, wait_flag,
)
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv, pingpong


@frozen
class Stream:
    """A GM operand read or written row by row: row r is `row_bytes` at
    tensor.addr + offset + r * stride (stride 0: row_bytes, rows back to back).

    In UB row r sits at r * ub_row_bytes (0: row_bytes). When either pitch differs
    from row_bytes a tile moves as one segment per row (DataCopyPad: a strided GM
    layout such as one half of a [.., 2h] row, or rows padded to 32 bytes in UB so
    per-row vector instructions start aligned)."""

    tensor: GmTensor
    row_bytes: int
    offset: int = 0
    stride: int = 0
    ub_row_bytes: int = 0

    @property
    def gm_pitch(self) -> int:
        return self.stride or self.row_bytes

    @property
    def ub_pitch(self) -> int:
        return self.ub_row_bytes or self.row_bytes

    @property
    def rowwise(self) -> bool:
        """True when a tile of several rows is not one contiguous run on both sides."""
        return self.gm_pitch != self.row_bytes or self.ub_pitch != self.row_bytes


@frozen
class Const:
    """A GM operand every core loads once into UB (a norm's weight, a scale vector).
    ub_bytes (0: nbytes) is the room it takes in UB and ub_offset where in that room
    the GM bytes land: e.g. an fp16 weight landing in the upper half of its fp32
    room, widened in place once by the kernel's `setup`."""

    tensor: GmTensor
    nbytes: int
    ub_bytes: int = 0
    ub_offset: int = 0


# compute(rows in tile, UB address of each input, of each output, of the scratch, of each const).
# The scratch is one address when tmp_row_bytes is an int, a tuple of addresses (one
# region per entry) when it is a sequence.
Compute = Callable[[int, Sequence[int], Sequence[int], int, Sequence[int]], list]


def streaming_kernel(
    name: str, op_type: str, hw: HwConfig, rows: int, ins: Sequence[Stream], outs: Sequence[Stream],
    compute: Compute, consts: Sequence[Const] = (), tmp_row_bytes: int | Sequence[int] = 0, quantum: int = 1,
    max_tile_rows: int | None = None, gm: Sequence[GmTensor] = (),
    setup: Callable[[Sequence[int]], list] | None = None, double_buffer: bool = True,
) -> Kernel:
    """`setup(const UB addresses)`: V instructions run once per core after the consts
    have arrived (e.g. cast a norm weight to fp32 once instead of every tile).
    A row that fits UB once but not twice over (with the scratch), or any row with
    double_buffer=False, is streamed single-buffered: one buffer set, so load, compute
    and store of a tile no longer overlap the next tile's."""
    for s in (*ins, *outs):
        if s.rowwise and s.ub_pitch % 32:
            raise ProgramError(f"op {op_type}: UB row pitch {s.ub_pitch} of '{s.tensor.name}' is not a multiple "
                               "of 32 bytes (pad it with ub_row_bytes)")
    tmp_parts = (tmp_row_bytes,) if isinstance(tmp_row_bytes, int) else tuple(tmp_row_bytes)
    tmp_total = sum(tmp_parts)
    buf = Buffers(hw, op_type)
    const_ub = [buf.alloc(f"const{i}", Mem.UB, c.ub_bytes or c.nbytes) for i, c in enumerate(consts)]
    used = max(buf.next.get(Mem.UB, 0), 0)
    per_row = sum(s.ub_pitch for s in (*ins, *outs))
    budget = hw.aiv.ub_bytes - used
    # Each ping/pong set holds every in and out tile; the scratch is shared.
    slack = 32 * ((len(ins) + len(outs)) * 2 + len(tmp_parts))  # alignment padding of each buffer
    nsets = 2
    tile_rows = (budget - slack) // (2 * per_row + tmp_total) if double_buffer else 0
    if tile_rows < 1:  # single-buffered
        nsets, slack = 1, slack - 32 * (len(ins) + len(outs))
        tile_rows = (budget - slack) // (per_row + tmp_total)
    if max_tile_rows:
        tile_rows = min(tile_rows, max_tile_rows)
    tile_rows = tile_rows // quantum * quantum if tile_rows >= quantum else tile_rows
    if tile_rows < 1:
        raise ProgramError(
            f"op {op_type}: one row needs {per_row + tmp_total + slack} bytes of UB (in, out and scratch, "
            f"single-buffered), {budget} left of {capacity_text(hw, Mem.UB)}")
    cores = hw.aiv_count
    per_core = align_up(cdiv(rows, cores), quantum)
    tile_rows = min(tile_rows, per_core)
    sets = []
    for p in range(nsets):
        sets.append(([buf.alloc(f"in{i}_{p}", Mem.UB, tile_rows * s.ub_pitch) for i, s in enumerate(ins)],
                     [buf.alloc(f"out{i}_{p}", Mem.UB, tile_rows * s.ub_pitch) for i, s in enumerate(outs)]))
    tmps = tuple(buf.alloc("tmp" if isinstance(tmp_row_bytes, int) else f"tmp{i}", Mem.UB, tile_rows * b) if b else 0
                 for i, b in enumerate(tmp_parts))
    tmp = tmps[0] if isinstance(tmp_row_bytes, int) else tmps
    blocks = cdiv(rows, per_core)

    def program(run: int) -> Program:
        tiles, tail = divmod(run, tile_rows)

        def tile(nr: int, first_row: int, j_step: int):
            def make(p: int, j_off: int) -> list:
                row0 = first_row + j_off * nr
                p %= nsets
                ub_in, ub_out = sets[p]

                def gm_addr(s: Stream):
                    return addr(s.tensor.addr + s.offset + row0 * s.gm_pitch,
                                block=per_core * s.gm_pitch, j=j_step * nr * s.gm_pitch)

                def load(s: Stream, ub: int) -> Copy:
                    if s.rowwise and nr > 1:
                        return Copy(Mem.GM, Mem.UB, gm_addr(s), ub, s.row_bytes, nr, s.gm_pitch, s.ub_pitch)
                    return Copy(Mem.GM, Mem.UB, gm_addr(s), ub, nr * s.row_bytes)

                def store(s: Stream, ub: int) -> Copy:
                    if s.rowwise and nr > 1:
                        return Copy(Mem.UB, Mem.GM, ub, gm_addr(s), s.row_bytes, nr, s.ub_pitch, s.gm_pitch)
                    return Copy(Mem.UB, Mem.GM, ub, gm_addr(s), nr * s.row_bytes)

                body = [WaitFlag(Pipe.V, Pipe.MTE2, p)]
                body += [load(s, ub) for s, ub in zip(ins, ub_in)]
                body += [SetFlag(Pipe.MTE2, Pipe.V, p), WaitFlag(Pipe.MTE2, Pipe.V, p),
                         WaitFlag(Pipe.MTE3, Pipe.V, p)]
                body += compute(nr, ub_in, ub_out, tmp, const_ub)
                body += [SetFlag(Pipe.V, Pipe.MTE2, p), SetFlag(Pipe.V, Pipe.MTE3, p),
                         WaitFlag(Pipe.V, Pipe.MTE3, p)]
                body += [store(s, ub) for s, ub in zip(outs, ub_out)]
                body += [SetFlag(Pipe.MTE3, Pipe.V, p)]
                return body
            return make

        ids = range(nsets)
        body: list = [SetFlag(Pipe.V, Pipe.MTE2, p) for p in ids] + [SetFlag(Pipe.MTE3, Pipe.V, p) for p in ids]
        if consts:
            body += [Copy(Mem.GM, Mem.UB, c.tensor.addr, ub + c.ub_offset, c.nbytes) for c, ub in zip(consts, const_ub)]
            body += [SetFlag(Pipe.MTE2, Pipe.V, 2), WaitFlag(Pipe.MTE2, Pipe.V, 2)]
            if setup is not None:
                body += setup(const_ub)
        body += pingpong("j", tiles, tile(tile_rows, 0, 2))
        if tail:
            body += tile(tail, tiles * tile_rows, 0)(tiles % 2, 0)
        body += [WaitFlag(Pipe.V, Pipe.MTE2, p) for p in ids] + [WaitFlag(Pipe.MTE3, Pipe.V, p) for p in ids]
        return Program(body, buf.buffers)

    full = program(per_core)
    last_run = rows - (blocks - 1) * per_core
    programs = [full] if last_run == per_core else [full] * (blocks - 1) + [program(last_run)]
    tensors = {t.name: t for t in (*gm, *(s.tensor for s in (*ins, *outs)), *(c.tensor for c in consts))}
    return Kernel(name, CoreType.AIV, blocks, aiv=programs, gm=list(tensors.values()), op_type=op_type)


def fill_kernel(name: str, hw: HwConfig, tensor: GmTensor, value: float, dtype: str = "fp32") -> Kernel:
    """Set a GM tensor to `value` (e.g. zero an output that partial sums are added into)."""
    e = DTYPE_BYTES[dtype]
    quantum = max(1, hw.l2.line_bytes // e)  # each core's share starts on an L2 line

    def compute(nr, ub_in, ub_out, tmp, consts):
        return [VecOp("dup", nr, dtype, ub_out[0], flops_per_elem=0, scalar=value)]

    return streaming_kernel(name, "fill", hw, tensor.nbytes // e, [], [Stream(tensor, e)], compute, quantum=quantum)


# ---------------------------------------------------------------- custom tile pipelines
#
# Kernels whose tiles do not follow one row stream (a layout change, a gather, a
# cache write) list their tiles explicitly: per core, a sequence of tiles, each
# loads (MTE2), vector work (V) and stores (MTE3) on ping/pong buffer set p.
# `compress` then folds runs of tiles whose addresses move by constant steps into
# Loops with Affine addresses, and `share_blocks` folds cores whose programs differ
# only by a constant step per block into one Program, so the IR stays small and
# the engine can simulate identical blocks once.

# the most tiles (tile loads, every pass's) a kernel that lists its tiles may take: each
# is built in Python and simulated, about a minute for this many
TILES_MAX = 1 << 19

# make(p) -> (loads, vector work, stores) of one tile on buffer set p (0 ping, 1 pong)
TileFn = Callable[[int], tuple[list, list, list]]


@functools.cache
def _stages(direct: bool, k: int) -> tuple[tuple, tuple, tuple, tuple]:
    """The flags of a tile on buffer set k: (before its loads, after its loads, before
    its stores, after its stores); its vector work, if any, runs between the second and
    the third. Built once: every tile of every pipeline shares these records."""
    if direct:
        return ((wait_flag(Pipe.MTE3, Pipe.MTE2, k),),
                (set_flag(Pipe.MTE2, Pipe.MTE3, k), wait_flag(Pipe.MTE2, Pipe.MTE3, k)),
                (),
                (set_flag(Pipe.MTE3, Pipe.MTE2, k),))
    return ((wait_flag(Pipe.V, Pipe.MTE2, k),),
            (set_flag(Pipe.MTE2, Pipe.V, k), wait_flag(Pipe.MTE2, Pipe.V, k), wait_flag(Pipe.MTE3, Pipe.V, k)),
            (set_flag(Pipe.V, Pipe.MTE2, k), set_flag(Pipe.V, Pipe.MTE3, k), wait_flag(Pipe.V, Pipe.MTE3, k)),
            (set_flag(Pipe.MTE3, Pipe.V, k),))


def tile_pipeline(tiles: Sequence[TileFn], direct: bool = False, period: int = 1, alike: int = 0) -> list:
    """The instructions of `tiles` run double-buffered: MTE2 loads tile i+1 while V
    works on tile i and MTE3 stores tile i-1. direct=True (no tile has vector work):
    MTE3 stores straight from the load buffer, MTE2 -> MTE3 flags, no V stage.
    period: the tiles move by constant steps from one run of `period` tiles to the next
    (tiles dealt round robin over a grid they do not divide), not from tile to tile;
    the runs loop, in the same order.
    alike: the caller's word that the first `alike` tiles are such runs, each the one
    before moved by the same steps: only the first two of them and the last are built
    (and checked against that word), so a long pipeline lowers in the time of a few
    runs. The result is the one every tile built would give."""
    run = math.lcm(period, 2)  # the tiles a loop body holds: whole runs, a ping and a pong each

    def body_of(i: int) -> list:
        body: list = []
        for j, make in enumerate(tiles[i:i + run]):
            k = j % 2
            loads, work, stores = make(k)
            before_loads, after_loads, before_stores, after_stores = _stages(bool(direct), k)
            body += [*before_loads, *loads, *after_loads, *(() if direct else work), *before_stores, *stores,
                     *after_stores]
        return body

    whole = min(alike, len(tiles)) // run  # bodies vouched for
    if whole < 3:
        return compress([body_of(i) for i in range(0, len(tiles), run)], "j")
    first = body_of(0)
    (shape, bases), (second, then) = _shape(first), _shape(body_of(run))
    final, last = _shape(body_of((whole - 1) * run))
    steps = _steps(bases, then)
    if not shape == second == final or _steps(bases, last) != [(whole - 1) * s for s in steps]:
        raise ValueError(f"tile_pipeline: the first {alike} tiles are not runs of {period} moving by constant steps")
    rest = [body_of(i) for i in range(whole * run, len(tiles), run)]
    more = 0  # bodies after those vouched for that go on alike (compress would loop them too)
    for body in rest:
        s, b = _shape(body)
        if s != shape or _steps(last, b) != steps:
            break
        more, last = more + 1, b
    return [Loop("j", whole + more, _shift(first, steps, "j"))] + compress(rest[more:], "j")


def pipeline_prologue(direct: bool = False) -> list:
    """Both buffer sets start free (pair with pipeline_epilogue)."""
    if direct:
        return [SetFlag(Pipe.MTE3, Pipe.MTE2, p) for p in (0, 1)]
    return [SetFlag(Pipe.V, Pipe.MTE2, p) for p in (0, 1)] + [SetFlag(Pipe.MTE3, Pipe.V, p) for p in (0, 1)]


def pipeline_epilogue(direct: bool = False) -> list:
    """Take back the 'free' flags so sets and waits balance."""
    if direct:
        return [WaitFlag(Pipe.MTE3, Pipe.MTE2, p) for p in (0, 1)]
    return [WaitFlag(Pipe.V, Pipe.MTE2, p) for p in (0, 1)] + [WaitFlag(Pipe.MTE3, Pipe.V, p) for p in (0, 1)]


def _map_addrs(items, fn) -> list:
    """Rebuild `items` with every address (Copy ends, VecOp operands) replaced by fn(addr),
    visited in a fixed order."""
    out = []
    for it in items:
        cls = it.__class__
        if cls is Loop:
            out.append(Loop(it.var, it.count, _map_addrs(it.body, fn)))
        elif cls is Copy:
            out.append(it.moved(fn(it.src_addr), fn(it.dst_addr)))
        elif cls is VecOp:
            out.append(it.moved(fn(it.dst), tuple(fn(s) for s in it.srcs)))
        else:
            out.append(it)
    return out


def _shape(items) -> tuple[tuple, list[int]]:
    """(the body with every address reduced to its loop terms, the address bases in order):
    two bodies with equal shapes differ only in where they point.

    The shape is a key, not a body: a Copy or VecOp is a tuple of its class and fields,
    its addresses (as _map_addrs visits them) replaced by their terms, a Loop one of
    Loop, its var, count and body's shape, anything else itself. Two keys are equal
    exactly when the bodies rebuilt that way would be, at a fraction of the cost (a
    lowering compares the shapes of tens of thousands of tiles)."""
    bases: list[int] = []
    return _shape_key(items, bases), bases


def _shape_key(items, bases: list[int]) -> tuple:
    """The shape of `items` (see _shape), their address bases appended to `bases`."""
    out = []
    for it in items:
        cls = it.__class__
        if cls is Loop:
            out.append((Loop, it.var, it.count, _shape_key(it.body, bases)))
        elif cls is Copy:
            out.append((Copy, it.src, it.dst, _terms(it.src_addr, bases), _terms(it.dst_addr, bases), it.nbytes,
                        it.segments, it.src_stride, it.dst_stride, it.convert))
        elif cls is VecOp:
            dst = _terms(it.dst, bases)
            out.append((VecOp, it.op, it.n, it.dtype, dst, tuple([_terms(a, bases) for a in it.srcs]), it.out_dtype,
                        it.out_n, it.flops_per_elem, it.scalar, it.scalar_src, it.pitches))
        else:
            out.append(it)
    return tuple(out)


def _terms(a, bases: list[int]) -> tuple:
    """An address's loop terms (() for a plain int); its base appended to `bases`."""
    if a.__class__ is int:
        bases.append(a)
        return ()
    bases.append(a.base)
    return a.terms


def _shift(items, steps: list[int], var: str) -> list:
    """`items` with address k moving by steps[k] per unit of `var`."""
    it = iter(steps)
    return _map_addrs(items, lambda a: moving(a, var, next(it)))


def _runs(bodies: Sequence[list]):
    """(first, last, steps) of each maximal run of consecutive bodies with the same
    shape whose addresses move by the same steps from one body to the next."""
    shapes = [_shape(b) for b in bodies]
    i = 0
    while i < len(bodies):
        j, steps = i, []
        if i + 1 < len(bodies) and shapes[i + 1][0] == shapes[i][0]:
            steps = _steps(shapes[i][1], shapes[i + 1][1])
            j = i + 1
            while j + 1 < len(bodies) and shapes[j + 1][0] == shapes[i][0] and _steps(
                    shapes[j][1], shapes[j + 1][1]) == steps:
                j += 1
        yield i, j, steps
        i = j + 1


def _steps(bases: list[int], then: list[int]) -> list[int]:
    """How far each address moves from one body to the next of the same shape."""
    return [b - a for a, b in zip(bases, then)]


def compress(bodies: Sequence[list], var: str) -> list:
    """Concatenate `bodies`, folding each run of consecutive bodies that have the same
    shape and whose addresses move by the same steps from one to the next into
    Loop(var, run length, first body with Affine steps)."""
    out: list = []
    for i, j, steps in _runs(bodies):
        if j > i:
            out.append(Loop(var, j - i + 1, _shift(bodies[i], steps, var)))
        else:
            out += list(bodies[i])
    return out


def share_blocks(bodies: Sequence[list]) -> list[list]:
    """One body per block -> one body per block where every run of blocks with the same
    shape, moving by constant steps per block, is the same list object using `block`
    (the first block of a run keeps its addresses: the run's body is shifted back)."""
    out: list = []
    for i, j, steps in _runs(bodies):
        if j > i:
            back = iter([-i * s for s in steps])
            base_body = _map_addrs(bodies[i], lambda a: shift(a, next(back)))
            out += [_shift(base_body, steps, "block")] * (j - i + 1)
        else:
            out.append(list(bodies[i]))
    return out


def tile_kernel(name: str, op_type: str, buffers, bodies: Sequence[list], gm: Sequence[GmTensor]) -> Kernel:
    """An AIV kernel from one body per block (each a complete program body): runs of
    blocks that differ by constant steps share one Program object."""
    shared = share_blocks(bodies)
    programs: list[Program] = []
    made: dict[int, Program] = {}
    for body in shared:
        if id(body) not in made:
            made[id(body)] = Program(body, buffers)
        programs.append(made[id(body)])
    if len({id(p) for p in programs}) == 1:
        programs = programs[:1]
    return Kernel(name, CoreType.AIV, len(bodies), aiv=programs, gm=list(gm), op_type=op_type)
