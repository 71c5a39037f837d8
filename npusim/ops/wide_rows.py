"""Row reductions whose row is too long for UB: several passes over column chunks.

A norm or softmax keeps a whole row in UB when it can (npusim.ops.rowwise). A row
too long for that is streamed in column chunks, once per pass, as an Ascend C
author would: the first passes accumulate the row's statistics (sum of squares,
mean, max, sum of exponentials) chunk by chunk into a few fp32 values in UB, the
scalar unit reads them back, and the last pass streams the chunks again and
applies them. The weights (gamma, beta) are as wide as the row, so they are
streamed chunk by chunk beside x (re-read for each row: L2 hits after the first).

One core takes whole rows (the statistics of a row stay on its core); rows are
split in contiguous runs over the vector cores, and each pass of each row is a
double-buffered tile pipeline (npusim.ops.vector_kernels.tile_pipeline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import GmTensor, Loop, Mem, VecOp
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv
from npusim.ops.layout import gm_copy, split_runs
from npusim.ops.vector import UB_BLOCK, cast, scalar_read, vop
from npusim.ops.vector_kernels import (
    compress, pipeline_epilogue, pipeline_prologue, tile_kernel, tile_pipeline,
)


@frozen
class Operand:
    """A [rows, cols] GM operand: row r at tensor.addr + offset + r * pitch (pitch 0:
    every row reads the same bytes, a weight)."""

    tensor: GmTensor
    pitch: int
    offset: int = 0


# work(n elements, UB in chunks, UB out chunks, UB scratch regions, UB stat addresses) -> V instructions
Work = Callable[[int, Sequence[int], Sequence[int], Sequence[int], Sequence[int]], list]


@frozen
class Pass:
    """One stream over a row's chunks; `after(stats)`: V / S instructions once the
    pass has seen the whole row (turn sums into the statistic the next pass applies)."""

    ins: tuple
    outs: tuple
    work: Work
    after: Callable[[Sequence[int]], list] = lambda stats: []


def widen(n: int, dtype: str, dst, src) -> list:
    """The chunk in fp32: a cast for 16-bit dtypes; fp32 is used where it lies (dst unused)."""
    return [] if dtype == "fp32" else [cast(n, dtype, "fp32", dst, src)]


def wide_row_kernel(op: str, hw: HwConfig, rows: int, cols: int, elem_bytes: int, passes: Sequence[Pass],
                    tmp_elem_bytes: Sequence[int], n_stats: int):
    """One AIV kernel running `passes` over each of `rows` rows of `cols` elements in
    column chunks as wide as UB allows (whole 32-byte blocks); `n_stats` fp32
    statistics per row live in UB between passes, set to 0 before the first."""
    n_in = max(len(p.ins) for p in passes)
    n_out = max(len(p.outs) for p in passes)
    step = UB_BLOCK // elem_bytes
    pad = UB_BLOCK * (2 * (n_in + n_out) + len(tmp_elem_bytes) + n_stats)  # alignment padding of each buffer
    per_elem = 2 * (n_in + n_out) * elem_bytes + sum(tmp_elem_bytes)
    w = (hw.aiv.ub_bytes - pad) // per_elem // step * step
    if w < step:
        raise ProgramError(f"op {op}: one {UB_BLOCK}-byte column chunk of shape[-1]={cols} does not fit "
                           f"{capacity_text(hw, Mem.UB)}")
    chunks = cdiv(cols, w)
    w = align_up(cdiv(cols, chunks), step)  # even chunks
    chunks = cdiv(cols, w)
    buf = Buffers(hw, op)
    sets = [([buf.alloc(f"in{i}_{p}", Mem.UB, w * elem_bytes) for i in range(n_in)],
             [buf.alloc(f"out{i}_{p}", Mem.UB, w * elem_bytes) for i in range(n_out)]) for p in (0, 1)]
    tmp = [buf.alloc(f"tmp{i}", Mem.UB, w * b) for i, b in enumerate(tmp_elem_bytes)]
    stats = [buf.alloc(f"stat{i}", Mem.UB, UB_BLOCK) for i in range(n_stats)]

    def tile(ps: Pass, r: int, c: int):
        nbytes = min(w, cols - c * w) * elem_bytes
        n = align_up(nbytes, UB_BLOCK) // elem_bytes  # vector instructions cover whole UB blocks

        def at(o: Operand) -> int:
            return o.tensor.addr + o.offset + r * o.pitch + c * w * elem_bytes

        def make(p: int):
            ub_in, ub_out = sets[p]
            return ([gm_copy(Mem.GM, Mem.UB, at(o), ub, nbytes) for o, ub in zip(ps.ins, ub_in)],
                    ps.work(n, ub_in, ub_out, tmp, stats),
                    [gm_copy(Mem.UB, Mem.GM, ub, at(o), nbytes) for o, ub in zip(ps.outs, ub_out)])
        return make

    def row(r: int) -> list:
        body = [VecOp("dup", 1, "fp32", s, flops_per_elem=0) for s in stats]
        for ps in passes:
            body += pipeline_prologue() + tile_pipeline([tile(ps, r, c) for c in range(chunks)])
            body += pipeline_epilogue() + ps.after(stats)
        return body

    def rows_of(lo: int, hi: int) -> list:
        """Rows lo..hi-1 as one loop: every row has row lo's shape, its GM addresses r x
        each operand's pitch further, so the first two rows give the loop (compress
        of them all, without building them all)."""
        if hi - lo < 2:
            return compress([row(r) for r in range(lo, hi)], "i")
        (loop,) = compress([row(lo), row(lo + 1)], "i")
        return [Loop(loop.var, hi - lo, loop.body)]

    bodies = [rows_of(lo, hi) for lo, hi in split_runs(rows, hw.aiv_count)]
    tensors = {o.tensor.name: o.tensor for ps in passes for o in (*ps.ins, *ps.outs)}
    return tile_kernel(op, op, buf.buffers, bodies, list(tensors.values()))


def accumulate(op: str, n: int, part, acc, src) -> list:
    """acc = combine(acc, reduce(src over n)): one reduce into `part`, one combine."""
    combine = "max" if op == "reduce_max" else "add"
    return [vop(op, n, "fp32", part, src, out_n=1), vop(combine, 1, "fp32", acc, acc, part)]


# ---------------------------------------------------------------- the ops' passes
#
# The same instruction sequences as the whole-row kernels of npusim.ops.rowwise, per
# chunk; 16-bit dtypes compute in fp32 (tmp[0] holds the widened chunk, tmp[1] a
# second fp32 chunk: squares, or a widened weight), fp32 works in the I/O buffers.


def _scratch(dtype: str) -> list[int]:
    return [4, 4] if dtype != "fp32" else [4]


def _fp32(dtype: str, tmp, ub):
    return tmp[0] if dtype != "fp32" else ub


def _sum_squares(n: int, w, tmp, stats) -> list:
    return [vop("mul", n, "fp32", tmp[-1], w, w)] + accumulate("reduce_sum", n, stats[-1], stats[0], tmp[-1])


def _rstd_from_sum_squares(stats) -> list:
    """rstd = rsqrt(sum / h + eps), then read by the scalar unit."""
    s = stats[0]
    return [vop("muls", 1, "fp32", s, s), vop("adds", 1, "fp32", s, s), vop("rsqrt", 1, "fp32", s, s)] + scalar_read()


def _apply_rms(dtype: str):
    """y = w * rstd * gamma per chunk; ins (the normalised row, gamma)."""
    def work(n, ub_in, ub_out, tmp, stats):
        up = dtype != "fp32"
        w = _fp32(dtype, tmp, ub_in[0])
        g = tmp[1] if up else ub_in[1]
        dst = w if up else ub_out[0]
        ops = widen(n, dtype, w, ub_in[0]) + widen(n, dtype, g, ub_in[1])
        ops += [vop("muls", n, "fp32", dst, w), vop("mul", n, "fp32", dst, dst, g)]
        return ops + ([cast(n, "fp32", dtype, ub_out[0], w)] if up else [])
    return work


def wide_rms_norm(op: str, hw: HwConfig, rows: int, h: int, dtype: str, e: int, x, gamma, y, residual=None,
                  x_sum=None):
    """RMSNorm (or Add+RMSNorm with residual and x_sum) over column chunks: pass 1 sums
    the squares (and writes x + residual), pass 2 applies rstd and gamma."""
    row = Operand(x, h * e)
    if residual is None:
        def first(n, ub_in, ub_out, tmp, stats):
            w = _fp32(dtype, tmp, ub_in[0])
            return widen(n, dtype, w, ub_in[0]) + _sum_squares(n, w, tmp, stats)
        p1 = Pass((row,), (), first, _rstd_from_sum_squares)
        normalised = row
    else:
        def first(n, ub_in, ub_out, tmp, stats):
            if dtype == "fp16":  # s = x + r in fp16 (what the unfused add writes), normalise its fp32 cast
                ops = [vop("add", n, dtype, ub_out[0], ub_in[0], ub_in[1]), cast(n, dtype, "fp32", tmp[0], ub_out[0])]
                w = tmp[0]
            elif dtype == "bf16":
                ops = [cast(n, dtype, "fp32", tmp[0], ub_in[0]), cast(n, dtype, "fp32", tmp[1], ub_in[1]),
                       vop("add", n, "fp32", tmp[0], tmp[0], tmp[1]), cast(n, "fp32", dtype, ub_out[0], tmp[0])]
                w = tmp[0]
            else:
                ops, w = [vop("add", n, dtype, ub_out[0], ub_in[0], ub_in[1])], ub_out[0]
            return ops + _sum_squares(n, w, tmp, stats)
        normalised = Operand(x_sum, h * e)
        p1 = Pass((row, Operand(residual, h * e)), (normalised,), first, _rstd_from_sum_squares)
    p2 = Pass((normalised, Operand(gamma, 0)), (Operand(y, h * e),), _apply_rms(dtype))
    return wide_row_kernel(op, hw, rows, h, e, [p1, p2], _scratch(dtype), 2)


def wide_layer_norm(hw: HwConfig, rows: int, h: int, dtype: str, e: int, x, gamma, beta, y):
    """LayerNorm over column chunks: pass 1 sums x and x^2, var = E[x^2] - mean^2;
    pass 2 applies (x - mean) * rstd * gamma + beta."""
    up = dtype != "fp32"

    def first(n, ub_in, ub_out, tmp, stats):
        w = _fp32(dtype, tmp, ub_in[0])
        return (widen(n, dtype, w, ub_in[0]) + accumulate("reduce_sum", n, stats[2], stats[0], w)
                + _sum_squares(n, w, tmp, [stats[1], stats[2]]))

    def stats_done(stats):
        mean, sq, t = stats
        return [vop("muls", 1, "fp32", mean, mean), vop("mul", 1, "fp32", t, mean, mean),
                vop("muls", 1, "fp32", sq, sq), vop("sub", 1, "fp32", sq, sq, t), vop("adds", 1, "fp32", sq, sq),
                vop("rsqrt", 1, "fp32", sq, sq)] + scalar_read()

    def apply(n, ub_in, ub_out, tmp, stats):
        w = _fp32(dtype, tmp, ub_in[0])
        dst = w if up else ub_out[0]
        g, b = (tmp[1], tmp[1]) if up else (ub_in[1], ub_in[2])
        ops = widen(n, dtype, w, ub_in[0]) + [vop("adds", n, "fp32", w, w), vop("muls", n, "fp32", w, w)]
        ops += widen(n, dtype, g, ub_in[1]) + [vop("mul", n, "fp32", w, w, g)]
        ops += widen(n, dtype, b, ub_in[2]) + [vop("add", n, "fp32", dst, w, b)]
        return ops + ([cast(n, "fp32", dtype, ub_out[0], w)] if up else [])

    row = Operand(x, h * e)
    passes = [Pass((row,), (), first, stats_done),
              Pass((row, Operand(gamma, 0), Operand(beta, 0)), (Operand(y, h * e),), apply)]
    return wide_row_kernel("layer_norm", hw, rows, h, e, passes, _scratch(dtype), 3)


def wide_softmax(hw: HwConfig, rows: int, h: int, dtype: str, e: int, x, y):
    """Softmax over column chunks, three passes: the row max; the sum of exp(x - max);
    y = exp(x - max) * (1 / sum). (stat 0 starts as the lowest value: `dup`.)"""
    up = dtype != "fp32"
    row = Operand(x, h * e)

    def max_pass(n, ub_in, ub_out, tmp, stats):
        w = _fp32(dtype, tmp, ub_in[0])
        return widen(n, dtype, w, ub_in[0]) + accumulate("reduce_max", n, stats[2], stats[0], w)

    def exp_chunk(n, ub_in, tmp):
        w = _fp32(dtype, tmp, ub_in[0])
        return w, widen(n, dtype, w, ub_in[0]) + [vop("adds", n, "fp32", w, w), vop("exp", n, "fp32", w, w)]

    def sum_pass(n, ub_in, ub_out, tmp, stats):
        w, ops = exp_chunk(n, ub_in, tmp)
        return ops + accumulate("reduce_sum", n, stats[2], stats[1], w)

    def apply(n, ub_in, ub_out, tmp, stats):
        w, ops = exp_chunk(n, ub_in, tmp)
        ops += [vop("muls", n, "fp32", w if up else ub_out[0], w)]
        return ops + ([cast(n, "fp32", dtype, ub_out[0], w)] if up else [])

    passes = [Pass((row,), (), max_pass, lambda stats: scalar_read()),
              Pass((row,), (), sum_pass, lambda stats: [vop("div", 1, "fp32", stats[1], stats[1], stats[1])]
                   + scalar_read()),
              Pass((row,), (Operand(y, h * e),), apply)]
    return wide_row_kernel("softmax", hw, rows, h, e, passes, [4] if up else [], 3)
