"""MatMul with an operand whose rows the cube's DMA cannot convert on the way, as the
910B runs it: its vector cores convert that operand to NZ first.

The cube reads an ND operand as 16-column fractal blocks, converted by MTE2 on the
way (npusim.ops.matmul). hicann/ops-nn's MatMulV3 host tiling (op_host
matmul_v3_base_tiling.cpp, GetMoreArgs) does that only when the operand's inner axis
(A's K; B's N, or K with trans_b) is a multiple of 256 bytes and at most 65,535
elements, or is one of the short rows the DMA converts whole (32 to 256 and 384
bytes); fp32 rows under 65,535 elements (HF32 off, torch's default) stay on the DMA
too. Any other operand is converted by the vector cores into a GM workspace
(op_kernel mat_mul_unaligned_base_kernel.h, MatrixAtoNZV2 / MatrixBtoNZV2), in the
same MIX kernel: every AIV takes a share of the operand's rows, then SyncAll, then
the cube multiplies as usual, reading that operand as NZ.

A vector core converts `rows` rows at a time: MTE2 reads them, each row padded to
whole 16-column blocks in UB (zeroed first when the row is not: the pad columns are
multiplied by the cube), V gathers them into fractal order, MTE3 writes one segment
per 16-column block into the workspace.
# assumption: a vector core's chunks are not double-buffered (each load waits for the
#   chunk before it to be written); the measured unaligned GEMMs convert one or two
#   chunks a core.
# assumption: a transposed B ([n, k] with trans_b) is not converted here (no measured
#   row has one): it stays on the DMA, priced as an aligned one.
# assumption: the tiling's MATA-conflict rule (B converted when n is a multiple of 16,384
#   and m > 4096, k >= 6656) is not modelled.
"""

from __future__ import annotations

from npusim.hw import HwConfig
from npusim.hw.config import ND2NZ_ALIGN_BYTES
from npusim.isa.program import (
    DTYPE_BYTES, Copy, GmTensor, Loop, Mem, Pipe, Program, SyncAll, VecOp, addr,
)
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.matmul_msd import _after, _split

# Inner axes the DMA converts on the way whatever their alignment (GetMoreArgs'
# SUPPORT_ND2NZ_GM2L0, bytes) and the longest it converts at all (ND2NZ_ON_THE_FLY_LIMIT,
# elements); the alignment it needs: hw.config.ND2NZ_ALIGN_BYTES
ON_THE_WAY_BYTES = (32, 64, 96, 128, 160, 192, 224, 256, 384)
ON_THE_FLY_LIMIT = 65535
FRACTAL = 16  # columns of an NZ block


def _needs(inner: int, elem: int, dtype: str) -> bool:
    if dtype == "fp32" and inner < ON_THE_FLY_LIMIT:
        return False
    off = (inner * elem) % ND2NZ_ALIGN_BYTES != 0
    return (off or inner > ON_THE_FLY_LIMIT) and inner * elem not in ON_THE_WAY_BYTES


def nd2nz_operands(p) -> tuple[bool, bool]:
    """(A, B): which operands of a plain MatMul the vector cores convert to NZ (module doc)."""
    if p.dtype not in ("fp16", "bf16", "fp32") or p.weight_dtype or hasattr(p, "batch"):
        return False, False
    e = DTYPE_BYTES[p.dtype]
    a = p.format_a == "ND" and _needs(p.k, e, p.dtype)
    b = p.format_b == "ND" and not p.trans_b and _needs(p.n, e, p.dtype)
    return a, b


def conversion_program(hw: HwConfig, ops: list[tuple[GmTensor, GmTensor, int, int]], dtype: str, block: int,
                       blocks: int) -> Program:
    """Block `block`'s vector cores: for each (ND source, NZ workspace, rows, cols) of
    `ops`, convert the block's share of the rows (an even split over the blocks, halved
    between its two cores as npusim.ops.matmul_msd splits rows), then SyncAll. A row too
    long for UB is converted in pieces of whole blocks."""
    e = DTYPE_BYTES[dtype]
    room = hw.aiv.ub_bytes // (2 * len(ops))  # each operand's two buffers: rows as read, rows as blocks
    buf = Buffers(hw, "matmul")
    body: list = []
    for i, (src, nz, rows, cols) in enumerate(ops):
        per = cdiv(rows, blocks)
        first, each, sub1 = _split((min(rows, block * per), min(rows, (block + 1) * per)))
        if not each:
            continue
        width = min(align_up(cols, FRACTAL), room // e // FRACTAL * FRACTAL)  # columns a piece holds
        chunk = min(each, room // (width * e))  # rows a piece holds
        ub_in, ub_out = (buf.alloc(f"{x}{i}", Mem.UB, chunk * width * e) for x in ("nd", "nz"))
        at = (src, nz, rows, cols, e, dtype, ub_in, ub_out)
        whole, tail = divmod(each, chunk)
        for c0 in range(0, cols, width):
            w = min(width, cols - c0)
            if whole:
                body.append(Loop("c", whole, _piece(at, (first, sub1), 0, chunk, c0, w, chunk)))
            if tail:
                body += _piece(at, (first, sub1), whole * chunk, tail, c0, w, 0)
    return Program([*body, SyncAll()], buf.buffers)


def _piece(at: tuple, share: tuple[int, int], r0: int, n: int, c0: int, w: int, step: int) -> list:
    """Convert rows r0 .. r0 + n of a core's share (share: its first row, where sub 1
    starts past it), columns c0 .. c0 + w; `step`: the rows loop var c moves them by."""
    src, nz, rows, cols, e, dtype, ub_in, ub_out = at
    first, sub1 = share
    wp = align_up(w, FRACTAL)
    row = first + r0
    src_at = addr(src.addr + (row * cols + c0) * e, sub=sub1 * cols * e, c=step * cols * e)
    block = align_up(rows, FRACTAL) * FRACTAL * e  # GM bytes of one 16-column block of the NZ operand
    nz_at = addr(nz.addr + c0 // FRACTAL * block + row * FRACTAL * e, sub=sub1 * FRACTAL * e, c=step * FRACTAL * e)
    out = []
    if w % FRACTAL:  # the pad columns of the last block must be zeros (DataCopyPad's pad value)
        out.append(VecOp("dup", n * wp, dtype, ub_in, flops_per_elem=0, scalar=0.0))
    return out + [
        *_after(Pipe.V, Pipe.MTE2),
        Copy(Mem.GM, Mem.UB, src_at, ub_in, w * e, n, cols * e, wp * e),
        *_after(Pipe.MTE2, Pipe.V),
        # rows [n][wp] -> blocks [wp / 16][n][16]
        VecOp("copy", n * wp, dtype, ub_out, (ub_in,), flops_per_elem=0,
              pitches=((wp // FRACTAL, n * FRACTAL * e, FRACTAL * e), (n, FRACTAL * e, wp * e))),
        *_after(Pipe.V, Pipe.MTE3),
        Copy(Mem.UB, Mem.GM, ub_out, nz_at, n * FRACTAL * e, wp // FRACTAL, n * FRACTAL * e, block),
        *_after(Pipe.MTE3, Pipe.V),
    ]
