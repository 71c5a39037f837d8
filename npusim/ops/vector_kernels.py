"""The streaming vector kernel every AIV operator is built from.

Work is a sequence of `rows` units (a row of a norm, or one element of an
elementwise op), split over the AIV cores in equal contiguous runs (a multiple of
`quantum` rows, so each core's data starts on an L2 line). A core walks its run in
tiles that fit UB twice over (ping and pong): MTE2 loads a tile of every input,
V computes it, MTE3 stores every output, and flags let the three overlap. Blocks
with the same run length share one Program (addresses move with `block`), which
the engine can simulate once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    Buffer, Copy, CoreType, GmTensor, Kernel, Loop, Mem, Pipe, Program, SetFlag, VecOp, WaitFlag, addr,
)
from npusim.ops.build import Buffers, align_up, cdiv, pingpong


@frozen
class Stream:
    """A GM operand read or written row by row: row r is at tensor.addr + r * row_bytes
    (+ offset), optionally in `segments` pieces `stride` apart (a strided layout)."""

    tensor: GmTensor
    row_bytes: int
    offset: int = 0


@frozen
class Const:
    """A GM operand every core loads once into UB (a norm's weight, a scale vector)."""

    tensor: GmTensor
    nbytes: int


# compute(rows in tile, UB address of each input, of each output, of the scratch, of each const)
Compute = Callable[[int, Sequence[int], Sequence[int], int, Sequence[int]], list]


def streaming_kernel(
    name: str, op_type: str, hw: HwConfig, rows: int, ins: Sequence[Stream], outs: Sequence[Stream],
    compute: Compute, consts: Sequence[Const] = (), tmp_row_bytes: int = 0, quantum: int = 1,
    max_tile_rows: int | None = None, gm: Sequence[GmTensor] = (),
) -> Kernel:
    buf = Buffers(hw, op_type)
    const_ub = [buf.alloc(f"const{i}", Mem.UB, c.nbytes) for i, c in enumerate(consts)]
    used = max(buf.next.get(Mem.UB, 0), 0)
    per_row = sum(s.row_bytes for s in (*ins, *outs))
    budget = hw.aiv.ub_bytes - used
    # Each ping/pong set holds every in and out tile; the scratch is shared.
    slack = 32 * (len(ins) + len(outs) + 1) * 2  # alignment padding of each buffer
    tile_rows = (budget - slack) // (2 * per_row + tmp_row_bytes)
    if max_tile_rows:
        tile_rows = min(tile_rows, max_tile_rows)
    tile_rows = tile_rows // quantum * quantum if tile_rows >= quantum else tile_rows
    if tile_rows < 1:
        raise ProgramError(
            f"op {op_type}: one row needs {2 * per_row + tmp_row_bytes} bytes of UB (ping, pong and scratch), "
            f"UB has {budget} left")
    cores = hw.aiv_count
    per_core = align_up(cdiv(rows, cores), quantum)
    tile_rows = min(tile_rows, per_core)
    sets = []
    for p in (0, 1):
        sets.append(([buf.alloc(f"in{i}_{p}", Mem.UB, tile_rows * s.row_bytes) for i, s in enumerate(ins)],
                     [buf.alloc(f"out{i}_{p}", Mem.UB, tile_rows * s.row_bytes) for i, s in enumerate(outs)]))
    tmp = buf.alloc("tmp", Mem.UB, tile_rows * tmp_row_bytes) if tmp_row_bytes else 0
    blocks = cdiv(rows, per_core)

    def program(run: int) -> Program:
        tiles, tail = divmod(run, tile_rows)

        def tile(nr: int, first_row: int, j_step: int):
            def make(p: int, j_off: int) -> list:
                row0 = first_row + j_off * nr
                ub_in, ub_out = sets[p]

                def gm_addr(s: Stream):
                    return addr(s.tensor.addr + s.offset + row0 * s.row_bytes,
                                block=per_core * s.row_bytes, j=j_step * nr * s.row_bytes)

                body = [WaitFlag(Pipe.V, Pipe.MTE2, p)]
                body += [Copy(Mem.GM, Mem.UB, gm_addr(s), ub, nr * s.row_bytes) for s, ub in zip(ins, ub_in)]
                body += [SetFlag(Pipe.MTE2, Pipe.V, p), WaitFlag(Pipe.MTE2, Pipe.V, p),
                         WaitFlag(Pipe.MTE3, Pipe.V, p)]
                body += compute(nr, ub_in, ub_out, tmp, const_ub)
                body += [SetFlag(Pipe.V, Pipe.MTE2, p), SetFlag(Pipe.V, Pipe.MTE3, p),
                         WaitFlag(Pipe.V, Pipe.MTE3, p)]
                body += [Copy(Mem.UB, Mem.GM, ub, gm_addr(s), nr * s.row_bytes) for s, ub in zip(outs, ub_out)]
                body += [SetFlag(Pipe.MTE3, Pipe.V, p)]
                return body
            return make

        body: list = [SetFlag(Pipe.V, Pipe.MTE2, p) for p in (0, 1)] + [SetFlag(Pipe.MTE3, Pipe.V, p) for p in (0, 1)]
        if consts:
            body += [Copy(Mem.GM, Mem.UB, c.tensor.addr, ub, c.nbytes) for c, ub in zip(consts, const_ub)]
            body += [SetFlag(Pipe.MTE2, Pipe.V, 2), WaitFlag(Pipe.MTE2, Pipe.V, 2)]
        body += pingpong("j", tiles, tile(tile_rows, 0, 2))
        if tail:
            body += tile(tail, tiles * tile_rows, 0)(tiles % 2, 0)
        body += [WaitFlag(Pipe.V, Pipe.MTE2, p) for p in (0, 1)] + [WaitFlag(Pipe.MTE3, Pipe.V, p) for p in (0, 1)]
        return Program(body, buf.buffers)

    full = program(per_core)
    last_run = rows - (blocks - 1) * per_core
    programs = [full] if last_run == per_core else [full] * (blocks - 1) + [program(last_run)]
    tensors = {t.name: t for t in (*gm, *(s.tensor for s in (*ins, *outs)), *(c.tensor for c in consts))}
    return Kernel(name, CoreType.AIV, blocks, aiv=programs, gm=list(tensors.values()), op_type=op_type)


def fill_kernel(name: str, hw: HwConfig, tensor: GmTensor, value: float, dtype: str = "fp32") -> Kernel:
    """Set a GM tensor to `value` (e.g. zero an output that partial sums are added into)."""
    from npusim.isa.program import DTYPE_BYTES

    e = DTYPE_BYTES[dtype]
    quantum = max(1, 512 // e)

    def compute(nr, ub_in, ub_out, tmp, consts):
        return [VecOp("dup", nr, dtype, ub_out[0])]

    return streaming_kernel(name, "fill", hw, tensor.nbytes // e, [], [Stream(tensor, e)], compute, quantum=quantum)
