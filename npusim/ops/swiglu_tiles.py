"""SwiGLU as CANN's 910B SwiGlu kernel tiles it (hicann/ops-nn activation/swi_glu).

The kernel (op_kernel/swi_glu.cpp, swi_glu_single.hpp, glu_tiling_kernel.hpp) splits
the [rowLen, 2 * colLen] input (rowLen = the dims before the split dim, colLen half
of the rest: npusim's [rows, 2h]) into base tiles of baseRowLen x baseColLen
elements. The host tiling (op_host/swi_glu_tiling.cpp) picks the base shape from
UB, not from the core count:

- maxTileLen = UB / (bufferNum * 3 * sizeof(dtype) + n_tmp * 4) elements, whole
  32-byte blocks: the gate, up and output queues (bufferNum deep) and n_tmp fp32
  scratch tiles (fp16 and bf16: 2, the widened operand and the result; fp32: 1,
  a tensor of ones) all hold one tile (GetBufferNumAndDataLenPerUB);
- baseColLen starts at min(colLen, maxTileLen), cut to whole 512-byte L2 lines
  when a row needs more than one column tile; baseRowLen = maxTileLen / (baseColLen
  rounded up to 32 bytes). baseColLen then steps down one 512-byte line at a time,
  each candidate scored (CalcOptBaseShape / SaveOptBaseShape): more cores used,
  then fewer tiles, then a larger tile, then more full tiles win. So a row that
  would fit whole is still cut into column tiles when that gives fewer tiles;
- tiles go to the cores round robin (tile i on core i mod cores, cores = min(tiles,
  AIV count)), each core streaming its tiles through double-buffered queues;
  double buffering is dropped (bufferNum 1, larger tiles) when it would leave 2
  tiles a core and a single-buffered tiling gives 1 without using fewer cores.

A tile moves as one DataCopy (32-byte aligned colLen) or DataCopyPad (otherwise,
each row padded to 32 bytes in UB) per operand: baseRowLen segments of baseColLen
elements, GM rows 2h (gate, up) or h (output) apart. The vector work of a tile
covers its UB rows, padding included (curCalLen):

- fp16 and bf16 (swi_glu_bf16.hpp, SwigluVectorBF16<T, float, T>): compute in
  fp32: Cast(gate), Muls(-1), Exp, Adds(1), Div(gate / t), Cast(up), Mul, Cast out;
- fp32 (swi_glu_impl.hpp, SwigluVector): Muls(-1), Exp, Adds(1), Div(ones / t),
  Mul(gate), Mul(up) in the output tile, the ones Duplicated once a core at Init
  over a whole tile.
# assumption: the PipeBarrier<PIPE_V> between the kernel's vector instructions are
# not lowered: V runs its instructions in order, and npusim's other vector
# lowerings leave such barriers to the per-instruction start-up as well.

CANN's GeGlu (activation/ge_glu_v2) is a different kernel (its own tiling, a second
output): GeGLU keeps npusim.ops.vector.lower_gated.
"""

from __future__ import annotations

import math

from attrs import frozen

from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, GmTensor, Mem
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.layout import gm_copy, pipeline_kernel
from npusim.ops.vector import UB_BLOCK, cast, vop

# Ascend C DataCopy / DataCopyPad interface limits (swi_glu_tiling.cpp: DISCONTINE_COPY_MAX_*)
MAX_BLOCK_COUNT = 4095  # segments in one copy
MAX_BLOCK_LEN = 65535  # a segment's length: 32-byte blocks (aligned) or bytes (DataCopyPad)
MAX_STRIDE = 65535  # the gap between segments, in the same unit
FP32 = DTYPE_BYTES["fp32"]


@frozen
class SwigluTiling:
    base_rows: int
    base_cols: int
    double_buffer: bool
    aligned: bool  # colLen a whole number of 32-byte blocks
    cores: int
    tiles: int


def _align_down(n: int, r: int) -> int:
    return n // r * r if n >= r else 0


def swiglu_tiling(hw: HwConfig, rows: int, cols: int, dtype: str) -> SwigluTiling | None:
    """CANN's GluSingleTilingCalculator::CalcTiling (swi_glu_tiling.cpp) for rowLen=rows,
    colLen=cols; None when it finds no base shape (the host tiling would fail)."""
    e = DTYPE_BYTES[dtype]
    block = UB_BLOCK // e  # ubMinBlockLen
    line = hw.l2.line_bytes // e  # cacheLineLen (L2_CACHE_LINE_SIZE 512 B), also alignPackLen
    aligned = cols % block == 0
    n_tmp = 1 if dtype == "fp32" else 2  # SWIGLU_TBUF_NUM_FLOAT / _HALF / _BF16

    def must_be_one_row(base_cols: int) -> bool:  # MustBeSingleBaseRowLen: the GM stride would overflow
        if aligned:
            return cols * 2 - base_cols > MAX_STRIDE * block
        return (cols * 2 - base_cols) * e > MAX_STRIDE

    def calc(buffers: int):
        max_tile = _align_down(hw.aiv.ub_bytes // (buffers * 3 * e + n_tmp * FP32), block)
        best: dict = {}

        def save(br: int, bc: int) -> None:  # SaveOptBaseShape
            total = cdiv(rows, br) * cdiv(cols, bc)
            size, full = br * bc, (rows // br) * (cols // bc)
            used = min(total, hw.aiv_count)
            key = (used, -total, size, full)
            if not best or key > best["key"]:
                best.update(key=key, br=br, bc=bc, total=total, cores=used, per_core=cdiv(total, used))

        up = min(cols, max_tile, MAX_BLOCK_LEN if aligned else MAX_BLOCK_LEN // e)
        if line < up < cols:
            up = _align_down(up, line)
        bc = up
        if must_be_one_row(bc):
            save(1, bc)
            return best
        row_up = min(rows, MAX_BLOCK_COUNT)
        while True:
            br = min(max_tile // align_up(bc, block), row_up)
            if br < 1 or (br > 1 and must_be_one_row(bc)):
                return best
            if not (br > 1 and must_be_one_row(cols % bc)):
                save(br, bc)
            if bc <= line or br >= row_up:
                return best
            bc = bc - line if bc % line == 0 else _align_down(bc, line)

    best, double = calc(2), True
    if best and best["per_core"] == 2:
        single = calc(1)
        if single and single["per_core"] == 1 and single["cores"] >= best["cores"]:
            best, double = single, False
    if not best:
        return None
    return SwigluTiling(best["br"], best["bc"], double, aligned, best["cores"], best["total"])


def swiglu_kernel(op: str, hw: HwConfig, t: SwigluTiling, rows: int, h: int, dtype: str, x: GmTensor,
                  y: GmTensor):
    """The SwigluSingle kernel for tiling t over x [rows, 2h] -> y [rows, h]."""
    e = DTYPE_BYTES[dtype]
    block = UB_BLOCK // e
    pitch = t.base_cols if t.aligned else align_up(t.base_cols, block)  # a tile row in UB, elements
    tile_len = t.base_rows * pitch  # tileLength: every queue and scratch buffer holds one tile
    buf = Buffers(hw, op)
    sets = [([buf.alloc(f"gate_{p}", Mem.UB, tile_len * e), buf.alloc(f"up_{p}", Mem.UB, tile_len * e)],
             [buf.alloc(f"out_{p}", Mem.UB, tile_len * e)]) for p in range(2 if t.double_buffer else 1)]
    wide = dtype != "fp32"
    tmp = [buf.alloc(f"tmp{i}", Mem.UB, tile_len * FP32) for i in range(2 if wide else 1)]
    row_tiles, col_tiles = cdiv(rows, t.base_rows), cdiv(h, t.base_cols)

    def work(n: int, ub_in, ub_out) -> list:
        gate, up = ub_in
        out = ub_out[0]
        if wide:  # swi_glu_bf16.hpp: a = cast(gate); c = a / (1 + exp(-a)); a = cast(up); c *= a; out = cast(c)
            a, c = tmp
            return [cast(n, dtype, "fp32", a, gate), vop("muls", n, "fp32", c, a, scalar=-1.0),
                    vop("exp", n, "fp32", c, c), vop("adds", n, "fp32", c, c, scalar=1.0),
                    vop("div", n, "fp32", c, a, c), cast(n, dtype, "fp32", a, up),
                    vop("mul", n, "fp32", c, c, a), cast(n, "fp32", dtype, out, c)]
        ones = tmp[0]  # swi_glu_impl.hpp: c = 1 / (1 + exp(-gate)); c *= gate; c *= up
        return [vop("muls", n, dtype, out, gate, scalar=-1.0), vop("exp", n, dtype, out, out),
                vop("adds", n, dtype, out, out, scalar=1.0), vop("div", n, dtype, out, ones, out),
                vop("mul", n, dtype, out, out, gate), vop("mul", n, dtype, out, out, up)]

    def tile(idx: int):
        rt, ct = divmod(idx, col_tiles)  # CaclOneTileParam
        r0, c0 = rt * t.base_rows, ct * t.base_cols
        nr, nc = min(t.base_rows, rows - r0), min(t.base_cols, h - c0)
        upitch = nc if t.aligned else align_up(nc, block)  # a tail column tile's UB rows (calLen)
        n = nr * upitch

        def make(p: int):
            ub_in, ub_out = sets[p % len(sets)]
            src = x.addr + (r0 * 2 * h + c0) * e
            loads = [gm_copy(Mem.GM, Mem.UB, src + off, ub, nc * e, nr, 2 * h * e, upitch * e)
                     for off, ub in zip((0, h * e), ub_in)]
            stores = [gm_copy(Mem.UB, Mem.GM, ub_out[0], y.addr + (r0 * h + c0) * e, nc * e, nr, upitch * e, h * e)]
            return loads, work(n, ub_in, ub_out), stores
        return make

    total = row_tiles * col_tiles
    # SWIGLU_SINGLE_PROCESS: tile i on core i mod cores. A single-buffered tiling has one
    # tile a core (CalcTiling only picks it then), so its one buffer set is never reused
    # while in flight; the pipeline's pong set is the ping set.
    per_core = [[[tile(i) for i in range(core, total, t.cores)]] for core in range(t.cores)]

    def head(core: int) -> list:  # SwigluVector::InitUbBuffer: Duplicate(ones, 1.0, tileLength)
        return [] if wide else [vop("dup", tile_len, dtype, tmp[0], flops=0, scalar=1.0)]

    # a core's tiles i and i + lcm(cores, col_tiles) are at the same column, a fixed number
    # of rows apart: its runs of that many / cores tiles loop, alike while their rows are
    # whole (every row tile but a short last one)
    whole_rows = rows // t.base_rows * col_tiles  # the tiles before a short last row tile

    def alike(core: int) -> int:
        return max(0, cdiv(whole_rows - core, t.cores))

    return pipeline_kernel(op, op, buf, per_core, [x, y], head=head, period=math.lcm(t.cores, col_tiles) // t.cores,
                           alike=alike)
