"""W8A16 matmul past the MSD template as the 910B runs it: the vector cores antiquantise
the weight into a GM workspace, chunk by chunk, and the cube multiplies in fp16/bf16.

On the 910B, hicann/ops-nn's WeightQuantBatchMatmulV2 host tiling tries its templates in
order (op_host/op_tiling/weight_quant_batch_matmul_v2_tiling_registry.cpp): SplitK (a bf16
per-group white list), MsdGroup, Msd (per-channel, m <= 64, K and N multiples of 32:
npusim.ops.matmul_msd), CustomNzSplitK (an NZ weight), then Custom, which takes any fp16 or
bf16 antiquant scale (weight_quant_batch_matmul_v2_tiling_custom.cpp, IsCapable); the
Fixpipe template, whose scales ride in FixPipe (npusim.ops.matmul's widening of B on MTE1),
needs a uint64 scale. Custom's kernel (op_kernel/weight_quant_batch_matmul_v2_custom.h) is
one MIX kernel:

- the cube's work is cut along N into chunks of cubeBaseN x cubeBlockDimN columns (every
  core one baseN-wide run of each chunk, all of M and K);
- the AIVs antiquantise a chunk of the weight (every K row, the chunk's columns) into one
  of WEIGHT_CACHE_COUNT = 3 workspace slots, each taking a share of vecSingleK x
  vecSingleN blocks: int8 in (MTE2), cast, times the per-channel scale, fp16/bf16 out
  (MTE3) (AntiquantWeight: WeightCopyInAndCast, AntiQuantCompute, WeightCopyOut), then all
  of them signal the cubes (CrossCoreSetFlag SYNC_AIV_ONLY_ALL, then SYNC_AIV_AIC);
- each cube waits for the chunk, multiplies A by its columns of it (IterateAll, K not
  split), and frees the slot; the AIVs run a chunk ahead of the cubes.

So the weight crosses GM three times (int8 in, fp16 out, fp16 into L1) and, with one
chunk (N up to about 24 base_n), nothing overlaps the antiquantisation.

Here a chunk is max(1, cores // m tiles) tile columns; the chunks meet at a SyncAll (the
cubes on chunk c while the AIVs antiquantise chunk c + 1), which couples the two sides a
little more tightly than CANN's flags (its AIVs may run two chunks ahead of a slow cube).
# assumption: the cube's tiling is npusim's fp16 chooser's (base_m, base_n), K not split,
#   not CANN's MultiCoreMatmulTiling (closed source).
# assumption: the AIVs take the chunk's K rows in equal shares, pieces of whole chunk rows
#   through two sets of UB buffers (CANN: 32 x 512 blocks, double-buffered queues).
# assumption: a bf16 weight is antiquantised through fp32 (cast, fp32 mul, cast back), an
#   fp16 one in fp16; the antiquant offset is not modelled (calibrate.cube_rows).
# assumption: only an ND weight stored [k, n] is lowered here; a transposed ([n, k]) or NZ
#   weight keeps npusim.ops.matmul's FixPipe-template path.
"""

from __future__ import annotations

import attrs

from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Copy, CoreType, GmTensor, Kernel, Mem, Pipe, Program, SetFlag, SyncAll, WaitFlag, addr,
)
from npusim.ops.build import Buffers, align_up, boxes, cdiv, pingpong
from npusim.ops.matmul_msd import _split, msd_applies
from npusim.ops.matmul_program import _box, _epilogue, _Layout, _prologue
from npusim.ops.registry import GmArena, Lowered, TensorInfo
from npusim.ops.vector import UB_BLOCK, cast, vop

WEIGHT_CACHE_COUNT = 3  # weight_quant_batch_matmul_v2_common.h: workspace slots of antiquantised chunks
_SCALE = 2  # flag id of the scale row's load (ids 0 and 1: the two row buffer sets)


def antiquant_applies(p) -> bool:
    """Whether CANN runs this W8A16 matmul as the Custom template (module doc)."""
    return (p.weight_dtype == "int8" and p.dtype in ("fp16", "bf16") and not msd_applies(p)
            and p.format_b == "ND" and not p.trans_b and not p.n_parts and not hasattr(p, "batch"))


def lower_antiquant(p, hw: HwConfig, gm: GmArena, tiling) -> Lowered:
    """The MIX kernel of the module doc."""
    from npusim.ops.matmul import alloc_plan, check_tiling, check_work
    from npusim.ops.matmul_tiling import choose_tiling

    m, n, k = p.m, p.n, p.k
    e, eo = DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    cube = attrs.evolve(p, weight_dtype="")  # the cube multiplies A by the antiquantised weight
    # every block's AIVs antiquantise (CANN's vecBlockDimN: up to all of them), its cube
    # idles through a chunk with fewer tiles than cores
    cores = check_tiling(tiling, p.dtype, hw, "matmul") if tiling else hw.chip.aic_count
    t = tiling or choose_tiling(cube, hw)
    check_work(p, t, k, 1, "matmul")  # the cube's tiles, K not split, as the FixPipe path's
    m_tiles, n_tiles = cdiv(m, t.base_m), cdiv(n, t.base_n)
    cols = max(1, cores // m_tiles)  # tile columns a chunk holds: every core one tile
    chunks = cdiv(n_tiles, cols)
    width = cols * t.base_n  # a chunk's columns (the last may be narrower)
    blocks = cores
    t = attrs.evolve(t, split_k=1, block_dim=blocks, a_resident=False)

    A, B, C = gm.tensor("a", m * k * e), gm.tensor("b", k * n), gm.tensor("c", m * n * eo)
    scale = gm.tensor("scale", n * 4)
    bias = gm.tensor("bias", n * 4) if p.bias else None
    slot = k * width * e
    W = gm.tensor("workspace", min(chunks, WEIGHT_CACHE_COUNT) * slot)

    la = _Layout(A, m, k, e, "ND")
    lc = (_Layout(C, m, n, eo, "ND"),)
    plan, buf = alloc_plan(cube, t, hw, "matmul", la, _Layout(W, k, width, e, "ND"), lc, ((0, n),), k, bias, None)
    dims = (1, m_tiles, n_tiles, 1)
    aic = []
    for b in range(blocks):
        body: list = [SyncAll()]
        for c in range(chunks):
            # chunk c's columns sit in its slot, rows `width` apart: a column j of C is column
            # j - c * width of the slot
            lb = _Layout(GmTensor("weight_cache", W.addr + c % WEIGHT_CACHE_COUNT * slot, slot), k, width, e, "ND")
            chunk_plan = attrs.evolve(plan, lb=lb.moved(-c * width * e))
            ncols = min(cols, n_tiles - c * cols)
            units = m_tiles * ncols
            per = cdiv(units, blocks)
            for start, extent in boxes(b * per, min(units, (b + 1) * per), (1, m_tiles, ncols, 1)):
                body += _box(chunk_plan, (start[0], start[1], start[2] + c * cols, start[3]), extent, dims)
            if c + 1 < chunks:
                body.append(SyncAll())
        aic.append(Program([*_prologue(t), *body, *_epilogue(t)], buf.buffers))
    aiv = [_antiquant_program(p, hw, B, scale, W, slot, width, chunks, b, blocks) for b in range(blocks)]
    kernel = Kernel("matmul", CoreType.MIX, blocks, aic=aic, aiv=aiv, gm=[x for x in (A, B, C, scale, bias, W) if x],
                    workspace_bytes=W.nbytes, op_type="matmul")
    ins = [TensorInfo("a", (m, k), p.dtype), TensorInfo("b", (k, n), "int8"), TensorInfo("scale", (n,), "fp32")]
    ins += [TensorInfo("bias", (n,), "fp32")] if p.bias else []
    outs = [TensorInfo("c", (m, n), p.out_dtype)]
    return Lowered(op_type="matmul", params=p, tiling=t, kernels=[kernel], flops=2.0 * m * n * k,
                   min_gm_bytes=sum(x.nbytes for x in ins) + sum(x.nbytes for x in outs),
                   unit="cube", inputs=ins, outputs=outs, workspace_bytes=W.nbytes)


def _antiquant_program(p, hw: HwConfig, B, scale, W, slot: int, width: int, chunks: int, block: int,
                       blocks: int) -> Program:
    """Block `block`'s two vector cores: for each chunk, their share of its K rows, a piece
    of rows at a time through two sets of UB buffers (MTE2 loads one piece while V and MTE3
    work on the other): int8 in, cast, times the chunk's scales, out to the chunk's slot;
    then SyncAll (the cubes take the chunk)."""
    n, k, dtype = p.n, p.k, p.dtype
    e = DTYPE_BYTES[dtype]
    wide = "fp16" if dtype == "fp16" else "fp32"  # the dtype the scale multiplies in
    buf = Buffers(hw, "matmul")
    w_pad = align_up(width, UB_BLOCK)
    ub_s = buf.alloc("scale", Mem.UB, w_pad * 4)
    ub_sw = buf.alloc("scale_w", Mem.UB, w_pad * 2) if wide != "fp32" else ub_s
    per_row = w_pad * (1 + 2 + (4 + e if wide == "fp32" else 0))
    rows = max(1, min((hw.aiv.ub_bytes - buf.next[Mem.UB]) // (2 * per_row), 64))  # rows a piece holds
    sets = []
    for i in range(2):
        q, h = buf.alloc(f"w_int8_{i}", Mem.UB, rows * w_pad), buf.alloc(f"w_fp16_{i}", Mem.UB, rows * w_pad * 2)
        f = buf.alloc(f"w_fp32_{i}", Mem.UB, rows * w_pad * 4) if wide == "fp32" else None
        o = buf.alloc(f"w_out_{i}", Mem.UB, rows * w_pad * e) if wide == "fp32" else h
        sets.append((q, h, f, o, ub_sw))
    per = cdiv(k, blocks)
    first, each, sub1 = _split((min(k, block * per), min(k, (block + 1) * per)))
    body: list = [SetFlag(Pipe.V, Pipe.MTE2, i) for i in range(2)] + [SetFlag(Pipe.MTE3, Pipe.V, i) for i in range(2)]
    for c in range(chunks):
        c0 = c * width
        w = min(width, n - c0)
        out_at = W.addr + c % WEIGHT_CACHE_COUNT * slot
        if each:
            body += [SetFlag(Pipe.V, Pipe.MTE2, _SCALE), WaitFlag(Pipe.V, Pipe.MTE2, _SCALE),
                     Copy(Mem.GM, Mem.UB, scale.addr + c0 * 4, ub_s, w * 4),
                     SetFlag(Pipe.MTE2, Pipe.V, _SCALE), WaitFlag(Pipe.MTE2, Pipe.V, _SCALE)]
            if wide != "fp32":
                body.append(cast(w, "fp32", wide, ub_sw, ub_s))
            whole, tail = divmod(each, rows)
            at = (B, out_at, sub1, c0, w, width, n, dtype, wide)
            body += pingpong("r", whole, lambda s, j, at=at: _rows(at, first + j * rows, 2 * rows, rows, sets[s], s))
            if tail:
                body += _rows(at, first + whole * rows, 0, tail, sets[0], 0)
        body.append(SyncAll())
    body += [WaitFlag(Pipe.V, Pipe.MTE2, i) for i in range(2)] + [WaitFlag(Pipe.MTE3, Pipe.V, i) for i in range(2)]
    return Program(body, buf.buffers)


def _rows(at: tuple, row: int, step: int, nr: int, ub: tuple, s: int) -> list:
    """Antiquantise `nr` rows from `row` (sub 1 sub1 rows past) of the chunk's columns
    c0 .. c0 + w into the slot at out_at (rows `width` apart) with buffer set `s`; `step`:
    the rows the loop var r moves them by."""
    B, out_at, sub1, c0, w, width, n, dtype, wide = at
    ub_q, ub_h, ub_f, ub_o, ub_sw = ub
    e, ew = DTYPE_BYTES[dtype], DTYPE_BYTES[wide]
    w_pad = align_up(w, UB_BLOCK)
    src = addr(B.addr + row * n + c0, sub=sub1 * n, r=step * n)
    dst = addr(out_at + row * width * e, sub=sub1 * width * e, r=step * width * e)
    scaled = ub_h if wide == "fp16" else ub_f
    out = [WaitFlag(Pipe.V, Pipe.MTE2, s), Copy(Mem.GM, Mem.UB, src, ub_q, w, nr, n, w_pad),
           SetFlag(Pipe.MTE2, Pipe.V, s), WaitFlag(Pipe.MTE2, Pipe.V, s), WaitFlag(Pipe.MTE3, Pipe.V, s),
           cast(nr * w_pad, "int8", "fp16", ub_h, ub_q)]
    if wide == "fp32":
        out.append(cast(nr * w_pad, "fp16", "fp32", ub_f, ub_h))
    # every row times the chunk's scales (the scale row repeated: src 1 pitch 0); not the
    # op's FLOPs (those are the Mmads')
    out.append(vop("mul", nr * w_pad, wide, scaled, scaled, ub_sw, flops=0,
                   pitches=((nr, w_pad * ew, w_pad * ew, 0),)))
    if wide == "fp32":
        out.append(cast(nr * w_pad, "fp32", dtype, ub_o, ub_f))
    return out + [SetFlag(Pipe.V, Pipe.MTE2, s), SetFlag(Pipe.V, Pipe.MTE3, s), WaitFlag(Pipe.V, Pipe.MTE3, s),
                  Copy(Mem.UB, Mem.GM, ub_o, dst, w * e, nr, w_pad * e, width * e), SetFlag(Pipe.MTE3, Pipe.V, s)]
