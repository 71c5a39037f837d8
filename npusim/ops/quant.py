"""INT8 activations for W8A8 matmuls, on the vector cores (AIV).

A W8A8 Linear is three kernels:

1. quantize_per_token: x [rows, h] (fp16/bf16) -> y int8 [rows, h] and a per-token
   scale fp32 [rows]: scale = max_j |x_j * smooth_j| / 127, y = rint(x * smooth / scale).
   `smooth` (optional, fp32 [h]) is SmoothQuant's migration: the activation is divided
   by per-channel factors s (smooth = 1 / s) whose inverse the weight was multiplied
   by offline, so outlier channels shrink before the row's scale is taken.
2. the matmul, int8 x int8 on the cube (its int8 fractal and rate), int32 in L0C,
   FixPipe applying the weight's per-channel scales, out fp32 (npusim.ops.matmul).
3. token_dequant: c fp32 [rows, n] -> y = c * scale[row] (+ bias) in the model dtype.

Scales are dynamic (computed from each token at run time), so nothing but the
weights needs calibrating; a row of zeros gets the scale MIN_AMAX / 127.
# assumption: the device casts fp32 -> fp16 -> int8 (two roundings); the numpy
# reference rounds once (rint of the fp32 quotient).
"""

from __future__ import annotations

import contextlib

import numpy as np
from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Loop, Mem, addr
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.layout import gm_copy, pipeline_kernel, split_runs
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.row_stats import MAX_REPEATS, STAT_BYTES, STAT_F32, brcb, broadcast_rows, over_rows, row_stat
from npusim.ops.vector import (
    UB_BLOCK, cast, dtype_validator, per_row, quantum, scalar_read, vector_lowered, vop,
)
from npusim.ops.vector_kernels import Const, Stream, streaming_kernel

INT8_MAX = 127
# The smallest row maximum a scale is taken from (a guard against dividing by zero
# on an all-zero row; far below any activation a decoder carries).
MIN_AMAX = 1e-8


def token_scales(v: np.ndarray) -> np.ndarray:
    """Per-row scale of a [rows, h] fp32 array: max |x| / 127 (MIN_AMAX guards zero rows)."""
    return np.maximum(np.max(np.abs(v), axis=1), MIN_AMAX) / INT8_MAX


def reference_quantize(p, x, specs, ctx) -> dict:
    """y = x * smooth / scale (rounded to int8 by the store of a device run), scale per row."""
    v = x["x"].reshape(p.rows, p.hidden).astype(np.float32)
    if p.smooth:
        v = v * x["smooth"].reshape(p.hidden)
    scale = token_scales(v).astype(np.float32)
    return {"y": v / scale[:, None], "scale": scale}


def reference_token_dequant(p, x, specs, ctx) -> dict:
    c = x["c"].reshape(p.rows, p.cols) * x["scale"].reshape(p.rows, 1)
    if p.bias:
        c = c + x["bias"].reshape(p.cols)
    return {"y": c}


@frozen
class QuantizeParams:
    rows: int = param(8, "tokens (rows of x)", validator=lambda i, a, v: _positive(a, v))
    hidden: int = param(4096, "elements per token (rows are padded to 32-byte blocks in UB)",
                        validator=lambda i, a, v: _positive(a, v))
    dtype: str = param("fp16", "dtype of x", validator=dtype_validator(("fp16", "bf16")))
    smooth: bool = param(False, "multiply x by per-channel SmoothQuant factors (fp32 [hidden]) before taking "
                         "the scale")
    smooth_alpha: float = param(0.5, "SmoothQuant migration strength the factors were made with offline "
                                "(npusim.graph.quant_values), in (0, 1] as the quantize pass's --smooth-alpha; "
                                "the kernel only applies them", validator=lambda i, a, v: _alpha(a, v))


@frozen
class TokenDequantParams:
    rows: int = param(8, "tokens (rows of c)", validator=lambda i, a, v: _positive(a, v))
    cols: int = param(4096, "output channels (columns of c)", validator=lambda i, a, v: _positive(a, v))
    dtype: str = param("fp16", "dtype of y", validator=dtype_validator(("fp16", "bf16")))
    bias: bool = param(False, "add an fp32 bias row after scaling (a W8A8 projection's bias)")


def _alpha(attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"'{attribute.name}' must be a number in (0, 1], got {value!r}")


def _positive(attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"'{attribute.name}' must be a positive integer, got {value!r}")


# CANN's 910B DynamicQuant quantises many rows per instruction only for rows of at least
# MULTI_ROW_MIN elements, a multiple of MULTI_ROW_ALIGN; any other row takes its own
# instructions, though a tile of such rows still moves as one DMA (hicann/ops-nn
# quant/dynamic_quant op_host dynamic_quant_tiling.cpp: CheckMultiRowPreconditions, else
# the generic kernels' multiRowNum = min(255, rows UB holds); op_kernel dynamic_quant_db.h)
MULTI_ROW_MIN, MULTI_ROW_ALIGN = 128, 8


def rows_together(hidden: int) -> bool:
    """Whether DynamicQuant takes several rows per instruction (see MULTI_ROW_MIN)."""
    return hidden >= MULTI_ROW_MIN and hidden % MULTI_ROW_ALIGN == 0


@register("quantize_per_token", QuantizeParams, reference=reference_quantize, ins=("x", "smooth"),
          outs=("y", "scale"))
def lower_quantize(p: QuantizeParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Per-token dynamic INT8 quantisation: y = rint(x * smooth / scale), scale = max|x * smooth| / 127
    (several rows per instruction, or a tile of rows each with its own instructions: rows_together)."""
    h, e = p.hidden, DTYPE_BYTES[p.dtype]
    # rows are padded in UB to whole 32-byte blocks of the int8 output (DataCopyPad):
    # every per-row instruction runs over hp elements
    hp = align_up(h, UB_BLOCK)
    x = gm.tensor("x", p.rows * h * e)
    y = gm.tensor("y", p.rows * h)
    scale = gm.tensor("scale", p.rows * 4)
    consts = [Const(gm.tensor("smooth", h * 4), h * 4, hp * 4)] if p.smooth else []

    def packed(nr, ub_in, ub_out, tmp, c):
        """Rows of MULTI_ROW_MIN+ aligned elements, as CANN's MultiRow kernel runs a tile
        (dynamic_quant_multi_row.h): every step over the whole tile but the first folds of
        each row's maximum (one Max per row down to one repeat, then one WholeReduceMax
        repeating over the rows); 127 / amax is broadcast (Brcb, BroadCast) and multiplied in."""
        n, lanes = nr * hp, hw.aiv.vector_repeat_bytes // 4  # fp32 elements of one repeat
        w, a, st, blk = tmp  # w: x (* smooth) fp32; a: |w|, then the scaled values; st: amax; blk: Brcb blocks
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])]
        if p.smooth:  # the factors are one [h] row, read again for every row
            ops.append(over_rows("mul", nr, hp, hp * 4, w, w, c[0]))
        ops.append(vop("abs", n, "fp32", a, w))
        ops += per_row(nr, hp * 4, lambda at: [vop("max", hp - lanes, "fp32", at(a), at(a + lanes * 4), at(a))])
        ops += [vop("reduce_max", nr * lanes, "fp32", st, a, out_n=nr, pitches=((nr, 4, hp * 4),)),
                vop("maxs", nr, "fp32", st, st),  # the MIN_AMAX guard
                vop("muls", nr, "fp32", ub_out[1], st),  # scale = amax / 127
                vop("div", nr, "fp32", st, st),  # 127 / amax
                brcb(nr, blk, st), broadcast_rows(nr, hp, hp * 4, a, blk), vop("mul", n, "fp32", a, w, a)]
        # fp32 -> fp16 -> int8 (rint): the 910B vector unit's cast path to int8
        return ops + [cast(n, "fp32", "fp16", a, a), cast(n, "fp16", "int8", ub_out[0], a)]

    def row_by_row(nr, ub_in, ub_out, tmp, c):
        """Any other row, as CANN's generic kernel runs a tile of rows (dynamic_quant_db.h
        ProcessSymmetric): the tile moves as one DMA, the vector work is one row at a
        time, its statistic kept in one block (Brcb + Div) - no scalar round trip."""
        w, a, blk = tmp  # w: x (* smooth) fp32; a: its fp16 copy; blk: a row's statistic block

        def at(base, pitch):
            return addr(base, r=pitch)

        x, w32, a16, y, b = at(ub_in[0], hp * e), at(w, hp * 4), at(a, hp * 2), at(ub_out[0], hp), at(blk, STAT_BYTES)
        ops = [cast(hp, p.dtype, "fp32", w32, x)]
        if p.smooth:
            ops.append(vop("mul", hp, "fp32", w32, w32, c[0]))
        # the row maximum is found on an fp16 copy (the reference takes it in fp32 - the
        # cost is what this sequence models)
        ops += [cast(hp, "fp32", "fp16", a16, w32), vop("abs", hp, "fp16", a16, a16),
                vop("reduce_max", hp, "fp16", b, a16, out_n=STAT_F32, out_dtype="fp32",
                    pitches=((1, STAT_BYTES, hp * 2),)),
                vop("maxs", STAT_F32, "fp32", b, b),  # the MIN_AMAX guard
                vop("div", STAT_F32, "fp32", b, b),  # 127 / amax
                row_stat("mul", hp, w32, w32, b)]
        # fp32 -> fp16 -> int8 (rint): the 910B vector unit's cast path to int8
        ops += [cast(hp, "fp32", "fp16", a16, w32), cast(hp, "fp16", "int8", y, a16)]
        # scale = amax / 127 for every row of the tile from its block: one strided Muls
        # assumption: CANN writes it row by row (a one-lane masked Mul each, 32-byte aligned
        # by masking, which the IR's alignment rule cannot say); one instruction a tile here
        scales = vop("muls", nr, "fp32", ub_out[1], blk, pitches=((nr, 4, STAT_BYTES),))
        return [Loop("r", nr, ops), scales]

    pad = hp != h

    def kernel(compute, tmp_row_bytes):
        return streaming_kernel("quantize_per_token", "quantize_per_token", hw, p.rows,
                                [Stream(x, h * e, ub_row_bytes=hp * e if pad else 0)],
                                [Stream(y, h, ub_row_bytes=hp if pad else 0), Stream(scale, 4)], compute,
                                consts=consts, tmp_row_bytes=tmp_row_bytes, quantum=quantum(hw, p.rows, h * e),
                                max_tile_rows=MAX_REPEATS)

    k = None
    if rows_together(h):
        # as CANN's MultiRow template: only rows UB holds with its full-width scratch
        with contextlib.suppress(ProgramError):
            k = kernel(packed, [hp * 4, hp * 4, 4, STAT_BYTES])
    if k is None:
        try:
            k = kernel(row_by_row, [hp * 4, hp * 2, STAT_BYTES])
        except ProgramError as err:  # assumption: rows are kept whole (a two-pass chunked row is not modelled)
            raise ProgramError(f"{err}: hidden={h} is too long to keep a row whole in UB") from None
    ins = [TensorInfo("x", (p.rows, h), p.dtype)] + ([TensorInfo("smooth", (h,), "fp32")] if p.smooth else [])
    # per element: abs, max, * 1/scale (and * smooth); per row: the scale and its inverse
    flops = (3 + int(p.smooth)) * p.rows * h + 3 * p.rows
    return vector_lowered("quantize_per_token", p, [k], flops, ins,
                          [TensorInfo("y", (p.rows, h), "int8"), TensorInfo("scale", (p.rows,), "fp32")])


@register("token_dequant", TokenDequantParams, reference=reference_token_dequant, ins=("c", "scale", "bias"),
          outs=("y",))
def lower_token_dequant(p: TokenDequantParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Per-token dequantisation of a W8A8 matmul's output: y = c * scale[row] (+ bias)."""
    n, e = p.cols, DTYPE_BYTES[p.dtype]
    pitch32, pitch = align_up(n * 4, UB_BLOCK), align_up(n * e, UB_BLOCK)
    c = gm.tensor("c", p.rows * n * 4)
    scale = gm.tensor("scale", p.rows * 4)
    y = gm.tensor("y", p.rows * n * e)
    consts = [Const(gm.tensor("bias", n * 4), n * 4, pitch32)] if p.bias else []
    whole = pitch32 // 4 == pitch // e  # padded rows line up: one cast per tile, else one per row

    def compute(nr, ub_in, ub_out, tmp, k):
        ops = scalar_read()  # the tile's token scales, read by the scalar unit
        ops += per_row(nr, pitch32, lambda at: [vop("muls", pitch32 // 4, "fp32", at(tmp), at(ub_in[0]))]
                       + ([vop("add", pitch32 // 4, "fp32", at(tmp), at(tmp), k[0])] if p.bias else []))
        if whole:
            return ops + [cast(nr * pitch // e, "fp32", p.dtype, ub_out[0], tmp)]
        return ops + [_row_casts(nr, pitch32, pitch, p.dtype, ub_out[0], tmp)]

    try:
        kern = streaming_kernel("token_dequant", "token_dequant", hw, p.rows,
                                [Stream(c, n * 4, ub_row_bytes=pitch32 if pitch32 != n * 4 else 0), Stream(scale, 4)],
                                [Stream(y, n * e, ub_row_bytes=pitch if pitch != n * e else 0)], compute,
                                consts=consts, tmp_row_bytes=pitch32, quantum=quantum(hw, p.rows, n * 4))
    except ProgramError:  # a row too long for UB (an LM head, a wide FFN): (row, column chunk) units
        kern = _dequant_chunks(p, hw, c, scale, consts[0].tensor if p.bias else None, y)
    ins = [TensorInfo("c", (p.rows, n), "fp32"), TensorInfo("scale", (p.rows,), "fp32")]
    ins += [TensorInfo("bias", (n,), "fp32")] if p.bias else []
    return vector_lowered("token_dequant", p, [kern], (1 + int(p.bias)) * p.rows * n, ins,
                          [TensorInfo("y", (p.rows, n), p.dtype)])


def _dequant_chunks(p: TokenDequantParams, hw: HwConfig, c, scale, bias, y):
    """token_dequant of rows too long for UB: units of (row, column chunk), split in
    contiguous runs over the vector cores, double-buffered (as npusim.ops.column_tiles);
    each unit loads its chunk of c (and of the bias) and its row's scale, which the
    scalar unit reads."""
    n, e = p.cols, DTYPE_BYTES[p.dtype]
    step = UB_BLOCK // e  # elements: whole UB blocks in the output dtype (and in fp32)
    per_elem = 2 * (4 + e + 4 * int(p.bias)) + 4  # ping and pong c, y (and bias) chunks, one fp32 scratch
    fit = (hw.aiv.ub_bytes - UB_BLOCK * 12) // per_elem // step * step
    chunks = max(cdiv(n, fit), min(cdiv(hw.aiv_count, p.rows), cdiv(n, step)))
    w = min(fit, align_up(cdiv(n, chunks), step))
    chunks = cdiv(n, w)
    buf = Buffers(hw, "token_dequant")
    sets = [([buf.alloc(f"c{q}", Mem.UB, w * 4), buf.alloc(f"scale{q}", Mem.UB, UB_BLOCK)]
             + ([buf.alloc(f"bias{q}", Mem.UB, w * 4)] if p.bias else []),
             buf.alloc(f"y{q}", Mem.UB, w * e)) for q in (0, 1)]
    tmp = buf.alloc("tmp", Mem.UB, w * 4)

    def unit(r: int, j: int):
        width = min(w, n - j * w)
        nv = align_up(width, step)  # vector instructions cover whole UB blocks

        def make(q: int):
            ins, out = sets[q]
            loads = [gm_copy(Mem.GM, Mem.UB, c.addr + (r * n + j * w) * 4, ins[0], width * 4),
                     gm_copy(Mem.GM, Mem.UB, scale.addr + r * 4, ins[1], 4)]
            work = scalar_read() + [vop("muls", nv, "fp32", tmp, ins[0])]
            if p.bias:
                loads.append(gm_copy(Mem.GM, Mem.UB, bias.addr + j * w * 4, ins[2], width * 4))
                work.append(vop("add", nv, "fp32", tmp, tmp, ins[2]))
            work.append(cast(nv, "fp32", p.dtype, out, tmp))
            return loads, work, [gm_copy(Mem.UB, Mem.GM, out, y.addr + (r * n + j * w) * e, width * e)]
        return make

    per_core = []
    for lo, hi in split_runs(p.rows * chunks, hw.aiv_count):
        per_core.append([[unit(r, k) for k in range(max(lo, r * chunks) - r * chunks, min(hi, (r + 1) * chunks) - r * chunks)]
                         for r in range(lo // chunks, cdiv(hi, chunks))])
    return pipeline_kernel("token_dequant", "token_dequant", buf, per_core, [t for t in (c, scale, bias, y) if t])


def _row_casts(nr: int, src_pitch: int, dst_pitch: int, dtype: str, dst, src) -> Loop:
    """One fp32 -> dtype cast per row when the padded rows of source and result do not line up."""
    return Loop("r", nr, [cast(src_pitch // 4, "fp32", dtype, addr(dst, r=dst_pitch), addr(src, r=src_pitch))])


__all__ = ["INT8_MAX", "MIN_AMAX", "QuantizeParams", "TokenDequantParams", "token_scales"]
