"""Elementwise maximum: y = max(x1, x2), x2 broadcast to x1 numpy-style (the same
shape, a row vector, or a value per row), on the vector cores as the other
elementwise ops (npusim.ops.vector); int64 on 32-bit lanes."""

from __future__ import annotations

import math

import numpy as np
from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, VecOp
from npusim.ops.build import align_up, cdiv
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import (MAX_DTYPES, UB_BLOCK, dtype_validator, eltwise_kernel, lower_eltwise, numel, per_row,
                               quantum, scalar_read, shape_validator, vector_lowered, vop)
from npusim.ops.vector_kernels import Stream


@frozen
class MaximumParams:
    shape: tuple = param((8, 4096), "shape of x1 and y", validator=shape_validator())
    shape2: tuple = param((), "shape of x2, broadcast to shape numpy-style (empty: shape)",
                          validator=shape_validator(min_ndim=0))
    dtype: str = param("fp16", "element dtype", validator=dtype_validator(MAX_DTYPES))


def broadcast_split(op: str, shape: tuple, shape2: tuple) -> tuple[int, int, int]:
    """x1 as [outer, mid, inner] where x2 is its [mid] part: x2 has x1's dims whole
    (mid) or of size 1. Modelled when x2's size-1 dims all come before (outer) or after
    (inner) its whole ones; a single value is one per row of x1's last dim."""
    if len(shape2) > len(shape):
        raise ProgramError(f"op {op}: x2 {shape2} has more dims than x1 {shape} (y would broadcast x1): not modelled")
    padded = (1,) * (len(shape) - len(shape2)) + tuple(shape2)
    if any(b not in (1, a) for a, b in zip(shape, padded)):
        raise ProgramError(f"op {op}: x2 {shape2} does not broadcast to x1 {shape}")
    dims = [(a, b == a) for a, b in zip(shape, padded) if a > 1]  # (size, x2 has it whole); size-1 dims tell nothing
    whole = [i for i, (_, w) in enumerate(dims) if w]
    if not whole:
        return numel(shape[:-1]), 1, shape[-1]
    lo, hi = whole[0], whole[-1] + 1
    if len(whole) != hi - lo:
        raise ProgramError(f"op {op}: x2 {shape2} broadcasts to x1 {shape} between dims it has whole: not modelled")
    return tuple(math.prod(a for a, _ in part) for part in (dims[:lo], dims[lo:hi], dims[hi:]))


def max_ops(n: int, dst, a, b, dt: str, mask=None) -> list:
    """dst = max(a, b) over n elements (dst may be a or b when dt is not int64)."""
    if dt != "int64":
        return [vop("max", n, dt, dst, a, b)]
    # assumed: no 64-bit ALU, so int64 max is what an Ascend C kernel does on 32-bit lanes:
    # each element a (low, high) pair of int32 words; three Compares over the 2n words
    # (low words unsigned >, high words ==, high words >; a lane mask picks the words),
    # each followed by a Select of whole pairs into dst through `mask` (a scratch of the
    # 2n bits): dst = lo_gt ? a : b; dst = hi_eq ? dst : b; dst = hi_gt ? a : dst.
    w = 2 * n
    ops = []
    for x, y in ((a, b), (dst, b), (a, dst)):
        ops += [VecOp("compare", w, "int32", mask, (a, b), "uint8", cdiv(w, 8), 0),
                vop("select", w, "int32", dst, x, y, flops=0)]
    return ops


def reference_maximum(p: MaximumParams, x, specs, ctx) -> dict:
    return {"y": np.maximum(x["x1"].reshape(p.shape), x["x2"].reshape(p.shape2 or p.shape))}


@register("maximum", MaximumParams, reference=reference_maximum, in_place=True, ins=("x1", "x2"), outs=("y",))
def lower_maximum(p: MaximumParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Elementwise maximum: y = max(x1, x2), x2 broadcast to x1 (a row vector, or a value per row)."""
    shape2 = p.shape2 or p.shape
    outer, mid, inner = broadcast_split("maximum", p.shape, shape2)
    n_tmp = 1 if p.dtype == "int64" else 0  # int64: the Compare mask (a row of the dtype: room to spare)
    if outer == inner == 1:  # x2 has x1's size: it streams like x1
        return lower_eltwise("maximum", p, hw, gm, ("x1", "x2"),
                             lambda n, s, d, t, dt: max_ops(n, d, s[0], s[1], dt, *t), 1, n_tmp, (p.shape, shape2))
    n, e = numel(p.shape), DTYPE_BYTES[p.dtype]
    x1, x2, y = gm.tensor("x1", n * e), gm.tensor("x2", mid * e), gm.tensor("y", n * e)
    k = _broadcast_max_kernel(p, hw, x1, x2, y, outer, mid, inner, n_tmp)
    return vector_lowered("maximum", p, [k], n, [TensorInfo("x1", p.shape, p.dtype), TensorInfo("x2", shape2, p.dtype)],
                          [TensorInfo("y", p.shape, p.dtype)])


def _broadcast_max_kernel(p: MaximumParams, hw: HwConfig, x1, x2, y, outer: int, mid: int, inner: int, n_tmp: int):
    """max(x1, x2) with x2 [mid] broadcast over x1 [outer, mid, inner]: x1 streams whole
    rows; x2 is loaded into UB once per core (a const), never streamed again. inner 1:
    x2 is a row vector, the row of every x1 row; else row r of x1 (`inner` elements)
    takes the one value x2[r % mid]."""
    e = DTYPE_BYTES[p.dtype]
    rows, row = (outer, mid) if inner == 1 else (outer * mid, inner)
    pitch = align_up(row * e, UB_BLOCK)  # rows padded to 32 bytes in UB: per-row instructions start aligned
    row_elems = pitch // e
    if inner == 1:
        # assumed: each row of a tile is one Max against the same UB row (the
        # instruction's repeats walk the row; its second operand does not move)
        def each_row(at, s, d, t, dt):
            return max_ops(row, at(d), at(s[0]), s[1], dt, *map(at, t))
    elif p.dtype == "int64":
        raise ProgramError(f"op maximum: int64 x1 {p.shape} with one x2 value per row {p.shape2}: not modelled "
                           "(no 64-bit Maxs)")
    else:
        # assumed: the scalar unit reads the tile's rows' values from UB (GetValue: one
        # V -> S -> V round trip per tile, as for a norm's statistics), and each row is
        # one Maxs with its value as the scalar operand
        def each_row(at, s, d, t, dt):
            return [vop("maxs", row, dt, at(d), at(s[0]))]

    def body(n, s, d, t, dt):
        ops = per_row(n // row_elems, row_elems * DTYPE_BYTES[dt], lambda at: each_row(at, s, d, t, dt))
        return ops if inner == 1 else scalar_read() + ops

    stream = [Stream(t, row * e, ub_row_bytes=pitch if pitch != row * e else 0) for t in (x1, y)]
    try:
        return eltwise_kernel("maximum", hw, p.dtype, rows, stream[:1], stream[1], row_elems, body, n_tmp,
                               quantum(hw, rows, row * e), consts=[(x2, mid)])
    except ProgramError as err:
        raise ProgramError(f"{err}: x2 {p.shape2} broadcast over rows of {row} elements of x1 {p.shape}") from None
