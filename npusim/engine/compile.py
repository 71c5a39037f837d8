"""Split a block program into one instruction stream per pipe, with costs.

Instructions on one pipe run in program order; different pipes run in parallel.
So a core's program becomes a stream per pipe (loops kept as loops), each entry
a record of its kind (Fixed, GmCopy, FlagSet, ...) holding what the pipe process
needs, so that it reads fields without looking anything up. The pipe process
tells the kinds apart by class (`entry.__class__ is Fixed`).

Fixed costs come from the config (never from constants here):
- Mmad: ceil(m/m0) * ceil(n/n0) * ceil(k/k0) cycles (the dtype's fractal) + start-up
- vector op: start-up + ceil(bytes / repeat bytes) repeats x the op's cycles per repeat, in whole cycles
  (bytes counted at the wider of the input and output dtype)
- MTE1 (L1 -> L0A/L0B/BT) and FixPipe to L1/FB: start-up + bytes / rate
- scalar: its cycles; PipeBarrier on one pipe: sync.pipe_barrier_cycles
GM copies (MTE2, MTE3, FixPipe -> GM) are timed by the memory system at run time:
start-up, then the bytes as a flow capped by the core's port rate and by one segment
per dma.segment_cycles.

Each stream is also compiled for the pipe's walk in C (code_of, _pipe.c): what a
pipe does on its own, its GM copies and its flags (cross-core ones too) run there;
barriers and SyncAll in pipe.py.
"""

from __future__ import annotations

import math

from attrs import define

from npusim.engine._pipe import Code
from npusim.engine.cycles import whole_cycles
from npusim.hw import HwConfig
from npusim.isa.program import (
    Affine, CORE_PIPES, DTYPE_BYTES, Copy, CoreType, CrossSetFlag, CrossWaitFlag, Loop, Mem, Mmad, Pipe,
    PipeBarrier, Program, Scalar, SetFlag, SyncAll, VecOp, WaitFlag, off_line_share,
)

# Stream entries: slotted attrs records, read by attribute (as fast as a slot read,
# faster than indexing a tuple). Not frozen: a frozen record's __init__ costs about
# three times as much, and entries are built for every program compiled; nothing
# changes them once built.


@define
class Fixed:
    """An instruction of fixed cost (cycles) on its pipe; `mem` and `nbytes`: the local
    buffer it writes into and how much (None, 0 if none)."""

    instr: object
    cost: int
    name: str
    flops: float = 0.0
    mem: str | None = None
    nbytes: int = 0


@define
class FixedRun:
    """Consecutive Fixed entries of one stream, run as one: their summed `cost` and
    `flops`, the bytes they write into each local buffer (`local`: (mem, bytes) pairs),
    and the entries themselves for an instruction trace. Merged only where every
    summand is a whole number, so the sums are exact in any order (see _merge_fixed)."""

    cost: int
    flops: float
    local: tuple
    entries: tuple


@define
class GmCopy:
    """A copy to or from GM, timed by the memory system: `startup` cycles, then
    `segments` pieces of `nbytes`, `stride` apart, from `gm_addr` (int or Affine;
    moving by `step` per block) at up to `cap` bytes/cycle; `local` the other buffer."""

    instr: object
    startup: int
    name: str
    write: bool
    cap: float
    gm_addr: object
    nbytes: int
    segments: int
    stride: int
    local: str
    step: int


@define
class FlagSet:
    """SetFlag: `key` = (src pipe, dst pipe, id)."""

    instr: object
    name: str
    key: tuple


@define
class FlagWait:
    """WaitFlag: `key` = (src pipe, dst pipe, id)."""

    instr: object
    name: str
    key: tuple


@define
class BarrierAll:
    """PipeBarrier(ALL): every pipe of the core meets, then pays `cost`."""

    instr: object
    cost: int
    name: str


@define
class SyncAllEntry:
    """SyncAll: every pipe of every core of the kernel meets, then pays `cost`."""

    instr: object
    cost: int
    name: str


@define
class CrossSet:
    """CrossSetFlag `flag` (AIC <-> AIV of one block)."""

    instr: object
    name: str
    flag: int


@define
class CrossWait:
    """CrossWaitFlag `flag`."""

    instr: object
    name: str
    flag: int


@define
class LoopEntry:
    """A loop of this pipe's share of a Loop: `body` runs `count` times with `var` = 0, 1, ..."""

    instr: object
    var: str
    count: int
    body: tuple


def _div_up(a: int, b: float) -> int:
    return math.ceil(a / b)


def _copy(c: Copy, core: CoreType, hw: HwConfig) -> Fixed | GmCopy:
    pipe = c.pipe
    name = f"{c.src.value}->{c.dst.value}"
    if Mem.GM in (c.src, c.dst):
        write = c.dst is Mem.GM
        port = hw.aic if core is CoreType.AIC else hw.aiv
        cap = port.gm_write_bytes_per_cycle if write else port.gm_read_bytes_per_cycle
        nbytes, segments, stride = c.nbytes, c.segments, c.stride(Mem.GM)
        if stride == nbytes:  # back-to-back segments are one contiguous segment
            nbytes, segments, stride = nbytes * segments, 1, nbytes * segments
        startup = hw.dma.startup_cycles
        # each segment takes the DMA engine segment_cycles (the cube's, or the vector
        # core's: their DMA units differ), while the data of the ones before it moves:
        # a transfer of many short segments is held to one (burst-rounded) segment per
        # segment_cycles, a long one is not slowed
        per_segment = hw.dma.segment_cycles_of(core is CoreType.AIC)
        if per_segment > 0:
            cap = min(cap, -(-nbytes // hw.dma.burst_bytes) * hw.dma.burst_bytes / per_segment)
        # segments starting off an L2 line cost the port more (Dma.off_line_scale)
        cap *= hw.dma.off_line_scale(nbytes, off_line_share(c.dst_addr if write else c.src_addr, segments, stride,
                                                            hw.l2.line_bytes))
        # ND rows converted to NZ on the way, their GM pitch off the conversion's alignment, move
        # at Dma.nd2nz_cap's rate, rows off a line included (the rate was measured on such rows);
        # counted before back-to-back rows are merged: they are still rows to convert
        held = hw.dma.nd2nz_cap(c.segments, c.stride(Mem.GM)) if core is CoreType.AIC and c.dst is Mem.L1 else 0.0
        if held:
            cap = min(cap, held)
        if pipe is Pipe.FIX:
            cap = min(cap, hw.aic.fixpipe_bytes_per_cycle)
            startup += hw.aic.fixpipe_startup_cycles
        gm_addr = c.dst_addr if write else c.src_addr
        local = c.src if write else c.dst
        return GmCopy(c, startup, name, write, cap, gm_addr, nbytes, segments, stride, local.value,
                      block_step(gm_addr))
    if pipe is Pipe.MTE1:
        rate = hw.aic.mte1_l0a_bytes_per_cycle if c.dst is Mem.L0A else hw.aic.mte1_l0b_bytes_per_cycle
        cost = hw.aic.mte1_startup_cycles + _div_up(c.total_bytes, rate)
    else:  # FixPipe L0C -> L1 or L1 -> FB
        cost = hw.aic.fixpipe_startup_cycles + _div_up(c.total_bytes, hw.aic.fixpipe_bytes_per_cycle)
    return Fixed(c, cost, name, mem=c.dst.value, nbytes=c.total_bytes)


def block_step(a) -> int:
    """How far an address moves from one block to the next (0 if it does not)."""
    return dict(a.terms).get("block", 0) if isinstance(a, Affine) else 0


def lower(instr, core: CoreType, hw: HwConfig) -> list[tuple[Pipe, object]]:
    """The (pipe, stream entry) pairs one instruction contributes."""
    cls = instr.__class__
    if cls is Copy:
        return [(instr.pipe, _copy(instr, core, hw))]
    if cls is Mmad:
        f = hw.aic.mmad_fractals[instr.dtype]
        cost = hw.aic.mmad_startup_cycles + (
            _div_up(instr.m, f.m0) * _div_up(instr.n, f.n0) * _div_up(instr.k, f.k0))
        return [(Pipe.M, Fixed(instr, cost, "Mmad", flops=instr.flops))]
    if cls is VecOp:
        elem = max(DTYPE_BYTES[instr.dtype], DTYPE_BYTES[instr.out_dtype or instr.dtype])
        repeats = _div_up(instr.n * elem, hw.aiv.vector_repeat_bytes)
        cost = whole_cycles(hw.aiv.vector_startup_cycles + repeats * hw.aiv.vector_cycles_per_repeat[instr.op])
        return [(Pipe.V, Fixed(instr, cost, instr.op, flops=instr.n * instr.flops_per_elem))]
    if cls is Scalar:
        return [(Pipe.S, Fixed(instr, instr.cycles, "Scalar"))]
    if cls is SetFlag:
        return [(instr.src, FlagSet(instr, f"SetFlag {instr.src.value}->{instr.dst.value} #{instr.id}",
                                    (instr.src.value, instr.dst.value, instr.id)))]
    if cls is WaitFlag:
        return [(instr.dst, FlagWait(instr, f"WaitFlag {instr.src.value}->{instr.dst.value} #{instr.id}",
                                     (instr.src.value, instr.dst.value, instr.id)))]
    if cls is PipeBarrier:
        if instr.pipe is not None:
            return [(instr.pipe, Fixed(instr, hw.sync.pipe_barrier_cycles, "PipeBarrier"))]
        entry = BarrierAll(instr, hw.sync.pipe_barrier_cycles, "PipeBarrier(ALL)")
        return [(p, entry) for p in CORE_PIPES[core]]
    if cls is SyncAll:
        entry = SyncAllEntry(instr, hw.sync.sync_all_cycles, "SyncAll")
        return [(p, entry) for p in CORE_PIPES[core]]
    if cls is CrossSetFlag:
        return [(instr.pipe, CrossSet(instr, f"CrossSetFlag #{instr.id}", instr.id))]
    if cls is CrossWaitFlag:
        return [(instr.pipe, CrossWait(instr, f"CrossWaitFlag #{instr.id}", instr.id))]
    raise TypeError(f"not an instruction: {instr!r}")


def _split(body: tuple, core: CoreType, hw: HwConfig, lowered: dict) -> dict[Pipe, list]:
    streams: dict[Pipe, list] = {p: [] for p in CORE_PIPES[core]}
    for item in body:
        if item.__class__ is Loop:
            for pipe, sub in _split(item.body, core, hw, lowered).items():
                if sub:
                    streams[pipe].append(LoopEntry(item, item.var, item.count, tuple(sub)))
        else:
            entries = lowered.get(item)
            if entries is None:
                entries = lowered[item] = lower(item, core, hw)
            for pipe, entry in entries:
                streams[pipe].append(entry)
    return {p: _merge_fixed(s) if len(s) > 1 else s for p, s in streams.items()}


def _merge_fixed(stream: list) -> list:
    """Runs of two or more consecutive Fixed entries become one FixedRun: a pipe
    advances its own clock through them without touching anything shared, so one
    step does what they do one by one. Entries whose flops or bytes are not whole
    numbers are left alone (float sums of whole numbers are exact in any order)."""
    out: list = []
    run: list = []

    def close() -> None:
        if len(run) > 1:
            local: dict = {}
            for e in run:
                if e.mem is not None:
                    local[e.mem] = local.get(e.mem, 0) + e.nbytes
            out.append(FixedRun(sum(e.cost for e in run), float(sum(e.flops for e in run)), tuple(local.items()),
                                tuple(run)))
        else:
            out.extend(run)
        run.clear()

    for e in stream:
        if e.__class__ is Fixed and float(e.flops).is_integer() and float(e.cost).is_integer() \
                and float(e.nbytes).is_integer():
            run.append(e)
        else:
            if run:
                close()
            out.append(e)
    close()
    return out


def compile_program(program: Program, core: CoreType, hw: HwConfig,
                    lowered: dict | None = None) -> tuple[tuple[Pipe, tuple, Code], ...]:
    """(pipe, stream, its Code) for every pipe of `core` that has work, in CORE_PIPES order;
    the Codes number the program's flags alike (see code_of). `lowered`: the stream
    entries of instructions already lowered for this core type and config, by value
    (instructions are frozen records; programs repeat most of theirs: other blocks,
    other layers), filled as it goes; entries are never changed once built, so
    programs may share them."""
    flags: dict = {}
    streams = _split(program.body, core, hw, {} if lowered is None else lowered)
    return tuple((p, tuple(s), code_of(s, flags)) for p, s in streams.items() if s)


# The local buffers, numbered for the C walk (it sums the bytes written into each).
MEMS = tuple(m.value for m in Mem)
_MEM_INDEX = {name: i for i, name in enumerate(MEMS)}


def code_of(stream, flags: dict) -> Code:
    """A stream compiled for the pipe's walk in C: per entry its kind (numbered as in
    _pipe.c), the entry and its name, and what the walk reads of it. A flag's key
    (src pipe, dst pipe, id) becomes its number in `flags` (added if new): the
    number the core's _pipe.Flags keeps it under, shared by the program's pipes."""
    ops = []
    for e in stream:
        kind = e.__class__
        if kind is Fixed:
            local = () if e.mem is None else ((_MEM_INDEX[e.mem], e.nbytes),)
            ops.append((0, e, e.name, e.cost, e.flops, local, ()))
        elif kind is FixedRun:
            ops.append((1, e, "", e.cost, e.flops, tuple((_MEM_INDEX[m], n) for m, n in e.local),
                        tuple((x.name, x.cost) for x in e.entries)))
        elif kind is FlagSet:
            ops.append((2, e, e.name, flags.setdefault(e.key, len(flags))))
        elif kind is FlagWait:
            ops.append((3, e, e.name, flags.setdefault(e.key, len(flags))))
        elif kind is LoopEntry:
            ops.append((4, e, "", e.var, e.count, code_of(e.body, flags)))
        elif kind is GmCopy:
            a = e.gm_addr
            base, terms = (a, ()) if a.__class__ is int else (a.base, a.terms)
            ops.append((6, e, e.name, e.startup, e.cap, e.write, base, terms, e.nbytes, e.segments, e.stride,
                        e.step, _MEM_INDEX[e.local]))
        elif kind is CrossSet:
            ops.append((7, e, e.name, e.flag))
        elif kind is CrossWait:
            ops.append((8, e, e.name, e.flag))
        else:  # done in pipe.py: barriers and SyncAll
            ops.append((5, e, e.name))
    return Code(tuple(ops), len(MEMS))


def count_instructions(body: tuple) -> int:
    """Instructions a program body executes, loops multiplied out (without walking them).
    Counted on the program, not its pipe streams, where a PipeBarrier(ALL) or SyncAll
    stands once per pipe."""
    return sum(item.count * count_instructions(item.body) if item.__class__ is Loop else 1 for item in body)
