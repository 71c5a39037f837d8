"""Row-wise vector (AIV) operators: RMSNorm, Add+RMSNorm, LayerNorm, softmax and RoPE.

One `streaming_kernel` each; rows are kept whole in UB and computed in fp32
(see npusim.ops.vector for the conventions every vector op follows). A norm or
softmax row too long for UB runs in column chunks (npusim.ops.wide_rows); RoPE's
row (a token's heads) is not split yet."""

from __future__ import annotations


import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Loop, addr
from npusim.ops.build import align_up
from npusim.ops.reference import softmax_rows
from npusim.ops.softmax_axis import softmax_axis_kernel
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Const, Stream, streaming_kernel
from npusim.ops.wide_rows import wide_layer_norm, wide_rms_norm, wide_softmax
from npusim.ops.row_stats import STAT_BYTES, STAT_F32, broadcast_rows, over_rows, row_reduce
from npusim.ops.vector import (
    UB_BLOCK, cast, dtype_validator, numel, per_row, quantum, scalar_read, shape_validator, vector_lowered, vop,
)


def _rms(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    h = gamma.size
    x = x.reshape(-1, h)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma.reshape(h)


def reference_rms_norm(p, x, specs, ctx) -> dict:
    return {"y": _rms(x["x"], x["gamma"], p.eps)}


def reference_add_rms_norm(p, x, specs, ctx) -> dict:
    s = x["x"] + x["residual"]
    # the device normalises the stored sum (what the unfused add would have written)
    return {"x_sum": s, "y": _rms(ctx.store(s, specs["x_sum"].dtype), x["gamma"], p.eps)}


def reference_layer_norm(p, x, specs, ctx) -> dict:
    h = x["gamma"].size
    v = x["x"].reshape(-1, h)
    v = v - v.mean(axis=-1, keepdims=True)
    y = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + p.eps)
    return {"y": y * x["gamma"].reshape(h) + x["beta"].reshape(h)}


def reference_softmax(p, x, specs, ctx) -> dict:
    v = np.moveaxis(x["x"].reshape(p.shape), p.dim, -1)
    return {"y": np.moveaxis(softmax_rows(v), -1, p.dim)}


def reference_rope(p, x, specs, ctx) -> dict:
    tokens, heads, d = p.shape
    v = x["x"].reshape(tokens, heads, d)
    cos = x["cos"].reshape(tokens, 1, d)
    sin = x["sin"].reshape(tokens, 1, d)
    rot = np.concatenate([-v[..., d // 2:], v[..., :d // 2]], axis=-1)  # rotate_half
    return {"y": v * cos + rot * sin}


@frozen
class NormParams:
    shape: tuple = param((8, 4096), "input shape [.., hidden]; normalised over the last dim",
                         validator=shape_validator())
    dtype: str = param("fp16", "dtype of x, the weights and y", validator=dtype_validator())
    # > 0 as a workload's norm_eps: 0 divides a zero row by 0, a negative one takes the
    # root of a negative variance (the kernels' cost is the same: a NaN, not an error)
    eps: float = param(1e-6, "added to the variance (> 0)", validator=validators.gt(0))


def _dim_in_shape(instance, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not -len(instance.shape) <= value < len(instance.shape):
        raise ValueError(f"'{attribute.name}' must be a dim of shape {instance.shape} "
                         f"(-{len(instance.shape)} .. {len(instance.shape) - 1}), got {value!r}")


@frozen
class SoftmaxParams:
    shape: tuple = param((8, 4096), "input shape", validator=shape_validator())
    dtype: str = param("fp16", "dtype of x and y", validator=dtype_validator())
    dim: int = param(-1, "the dim softmax runs over (negative: from the end)", validator=_dim_in_shape)


@frozen
class RopeParams:
    shape: tuple = param((8, 32, 128), "q or k: [tokens, heads, head_dim]", validator=shape_validator(ndim=3))
    dtype: str = param("fp16", "dtype of x, cos, sin and y", validator=dtype_validator())


@frozen
class _Rows:
    """A [rows, h] operand as it sits in UB: each row padded to 32 bytes (hp elements)."""

    rows: int
    h: int
    e: int
    pitch: int  # UB bytes of a row in the input dtype
    hp: int  # elements of a padded row
    lead: tuple

    @property
    def f32_pitch(self) -> int:
        return self.hp * 4

    def stream(self, tensor) -> Stream:
        return Stream(tensor, self.h * self.e, 0, 0, self.pitch if self.pitch != self.h * self.e else 0)


def row_kernel(op: str, r: _Rows, *args, wide=None, **kw):
    """streaming_kernel for whole rows; a row too long for UB is streamed in column
    chunks by `wide()` (npusim.ops.wide_rows), or is an error naming the parameter."""
    try:
        return streaming_kernel(op, op, *args, **kw)
    except ProgramError as err:
        if wide is not None:
            return wide()
        what = f"shape[-1]={r.h}" if op != "rope" else f"heads * head_dim = {r.h}"
        raise ProgramError(f"{err}: {what} is too long to keep a row whole in UB") from None


def _rows(shape: tuple, dtype: str) -> _Rows:
    *lead, h = shape
    e = DTYPE_BYTES[dtype]
    pitch = align_up(h * e, UB_BLOCK)
    return _Rows(numel(lead) if lead else 1, h, e, pitch, pitch // e, tuple(lead))


def _weight(gm: GmArena, name: str, r: _Rows, dtype: str) -> tuple[Const, object]:
    """A [h] weight every core loads once. A 16-bit weight lands in the upper half of
    an fp32 row and `setup` widens it in place (increasing addresses never overtake
    the unread half), so UB holds only the fp32 copy."""
    t = gm.tensor(name, r.h * r.e)
    if dtype == "fp32":
        return Const(t, r.h * r.e, r.pitch), t
    return Const(t, r.h * r.e, r.f32_pitch, r.f32_pitch - r.pitch), t


def _weight_setup(r: _Rows, dtype: str, n_weights: int):
    """Cast each weight to fp32 once per core; returns (setup, fp32 address of weight i)."""
    if dtype == "fp32":
        return None, lambda consts, i: consts[i]

    def setup(consts):
        return [cast(r.hp, dtype, "fp32", c, c + r.f32_pitch - r.pitch) for c in consts[:n_weights]]

    return setup, lambda consts, i: consts[i]


def _rms_ops_long(nr: int, r: _Rows, w, dst, sq, st, gamma32, eps: float) -> list:
    """_rms_ops for rows past MERGE_MAX_COLS, as CANN's AddRmsNorm runs them (add_rms_norm_tiling.cpp:
    MODE_MULTI_N / MODE_SINGLE_N, not MergeN): each row summed by the halving adds into its
    statistic block, the rstd read back by the scalar unit, applied one instruction a row."""
    ns = nr * STAT_F32
    ops = [vop("mul", nr * r.hp, "fp32", sq, w, w)]
    ops += per_row(nr, r.f32_pitch, lambda at: halving_sum(r.h, addr(st, r=STAT_BYTES), sq, at))
    ops += [vop("muls", ns, "fp32", st, st, scalar=1.0 / r.h), vop("adds", ns, "fp32", st, st, scalar=eps),
            vop("rsqrt", ns, "fp32", st, st)] + scalar_read()
    return ops + per_row(nr, r.f32_pitch, lambda at: [
        vop("muls", r.hp, "fp32", at(dst), at(w), scalar_src=addr(st, r=STAT_BYTES)),
        vop("mul", r.hp, "fp32", at(dst), at(dst), gamma32)])


def _rms_ops(nr: int, r: _Rows, w, dst, sq, st, gamma32, eps: float) -> list:
    """rstd = rsqrt(mean(w^2) + eps); dst = w * rstd * gamma (w, dst fp32 [nr, hp]), every
    step over the whole tile as CANN's MergeN kernel runs it (rms_norm_merge_n.h Compute):
    square, one reduction into each row's statistic block (st: nr blocks), the statistic
    steps on the blocks, rstd broadcast over the squares' room (sq) and multiplied in,
    gamma (one [h] row) applied to every row by one instruction. No scalar round trip.
    # assumption: the other form CANN uses - Brcb, then one Mul per 64 columns repeating
    # over the rows (RmsNorm's "performance" mode for 16-bit inputs of few dims;
    # add_rms_norm_merge_n.h) - costs about the same and is not modelled apart"""
    n = nr * r.hp
    ns = nr * STAT_F32
    # the reduction reads a row's h columns only (its padding to 32 bytes is never loaded)
    ops = [vop("mul", n, "fp32", sq, w, w)] + row_reduce("reduce_sum", nr, r.h, r.f32_pitch, st, sq)
    ops += [vop("muls", ns, "fp32", st, st, scalar=1.0 / r.h), vop("adds", ns, "fp32", st, st, scalar=eps),
            vop("rsqrt", ns, "fp32", st, st)]
    ops += [broadcast_rows(nr, r.hp, r.f32_pitch, sq, st), vop("mul", n, "fp32", dst, w, sq)]
    return ops + [over_rows("mul", nr, r.hp, r.f32_pitch, dst, dst, gamma32)]


# CANN's 910B RmsNorm keeps several rows per instruction only up to this many (aligned)
# columns ("MergeN"); a longer row is its own iteration (hicann/ops-nn
# norm/rms_norm/op_host/rms_norm_tiling.cpp, SMALL_REDUCE_NUM)
MERGE_MAX_COLS = 2000
# CANN's MergeN kernel queues one buffer per tensor (rms_norm_base.h BUFFER_NUM = 1): a tile's
# load, compute and store do not overlap the next tile's
MERGE_DOUBLE_BUFFER = False


def halving_sum(n: int, dst, src: int, at=lambda base: base) -> list:
    """One row's sum as CANN's single-row reduce takes it: fold the part beyond a power
    of two onto it, halve with Adds (the upper half onto the lower) down to one repeat of
    fp32 lanes, then one whole-repeat ReduceSum into dst (src is overwritten). `at`
    places an address in the row (per_row's)."""
    lanes, half = 64, 1 << max(0, n - 1).bit_length() - 1 if n > 1 else 1
    ops = [vop("add", n - half, "fp32", at(src), at(src), at(src + half * 4))] if n > half else []
    while half > lanes:
        half //= 2
        ops.append(vop("add", half, "fp32", at(src), at(src), at(src + half * 4)))
    return ops + [vop("reduce_sum", min(n, lanes), "fp32", dst, at(src), out_n=1)]


def _rms_norm_per_row(p: NormParams, r: _Rows, hw: HwConfig, x, gamma, y):
    """RMSNorm of rows longer than MERGE_MAX_COLS as CANN's 910B kernel runs them
    (rms_norm.h, "normal" mode): one row per iteration, every step a whole-row
    instruction in fp32 - cast in, square, the halving sum, the row's rstd on the
    scalar unit (a V -> S -> V round trip), scale, cast gamma (every row), multiply,
    cast out. # assumption: the next row's load overlaps this row's work (CANN's one
    input buffer is free again once it has been cast), as double buffering has it."""
    up = p.dtype != "fp32"
    g_const = Const(gamma, r.h * r.e, r.pitch)

    def compute(nr, ub_in, ub_out, tmp, consts):
        w, sq, st = tmp
        n = r.hp
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += [vop("mul", n, "fp32", sq, w if up else ub_in[0], w if up else ub_in[0])]
        ops += halving_sum(n, st, sq) + scalar_read()
        src = w if up else ub_in[0]
        dst = w if up else ub_out[0]
        ops += [vop("muls", n, "fp32", dst, src)]
        g32 = consts[0]
        if up:
            ops.append(cast(n, p.dtype, "fp32", sq, consts[0]))
            g32 = sq
        ops.append(vop("mul", n, "fp32", dst, dst, g32))
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    return streaming_kernel("rms_norm", "rms_norm", hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                            consts=[g_const], tmp_row_bytes=[r.f32_pitch, r.f32_pitch, 32], max_tile_rows=1)


@register("rms_norm", NormParams, reference=reference_rms_norm, ins=("x", "gamma"), outs=("y",))
def lower_rms_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma, over the last dim (rows up to
    MERGE_MAX_COLS several per instruction, longer ones one per iteration)."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    if r.hp > MERGE_MAX_COLS:
        gamma = gm.tensor("gamma", r.h * r.e)
        y = gm.tensor("y", r.rows * r.h * r.e)
        try:
            k = _rms_norm_per_row(p, r, hw, x, gamma, y)
        except ProgramError:
            k = wide_rms_norm("rms_norm", hw, r.rows, r.h, p.dtype, r.e, x, gamma, y)
        return vector_lowered("rms_norm", p, [k], 4 * r.rows * r.h + 3 * r.rows,
                              [TensorInfo("x", p.shape, p.dtype), TensorInfo("gamma", (r.h,), p.dtype)],
                              [TensorInfo("y", p.shape, p.dtype)])
    g_const, gamma = _weight(gm, "gamma", r, p.dtype)
    y = gm.tensor("y", r.rows * r.h * r.e)
    up = p.dtype != "fp32"
    setup, w32 = _weight_setup(r, p.dtype, 1)
    parts = ([r.f32_pitch] if up else []) + [r.f32_pitch, STAT_BYTES]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        w = tmp[0] if up else ub_in[0]
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += _rms_ops(nr, r, w, w if up else ub_out[0], tmp[-2], tmp[-1], w32(consts, 0), p.eps)
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("rms_norm", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                   consts=[g_const], tmp_row_bytes=parts, setup=setup, quantum=quantum(hw, r.rows, r.h * r.e),
                   double_buffer=MERGE_DOUBLE_BUFFER,
                   wide=lambda: wide_rms_norm("rms_norm", hw, r.rows, r.h, p.dtype, r.e, x, gamma, y))
    # per element: square, sum, * rstd, * gamma; per row: / h, + eps, rsqrt
    return vector_lowered("rms_norm", p, [k], 4 * r.rows * r.h + 3 * r.rows,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("gamma", (r.h,), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])


@register("add_rms_norm", NormParams, reference=reference_add_rms_norm, ins=("x", "residual", "gamma"),
          outs=("x_sum", "y"))
def lower_add_rms_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Residual add + RMSNorm: s = x + residual; y = rms_norm(s) * gamma; outputs s and y."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    res = gm.tensor("residual", r.rows * r.h * r.e)
    g_const, gamma = _weight(gm, "gamma", r, p.dtype)
    s_out = gm.tensor("x_sum", r.rows * r.h * r.e)
    y = gm.tensor("y", r.rows * r.h * r.e)
    setup, w32 = _weight_setup(r, p.dtype, 1)
    dt = p.dtype
    # fp16: s = x + r in fp16 (exactly what the unfused Add gives), then normalise its
    # fp32 cast; bf16: cast both, add in fp32, cast s back; fp32: normalise s itself.
    parts = ([r.f32_pitch] if dt != "fp32" else []) + [r.f32_pitch, STAT_BYTES]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        s_ub, y_ub = ub_out
        sq, st = tmp[-2], tmp[-1]
        if dt == "fp16":
            w = tmp[0]
            ops = [vop("add", n, dt, s_ub, ub_in[0], ub_in[1]), cast(n, dt, "fp32", w, s_ub)]
        elif dt == "bf16":
            w = tmp[0]
            ops = [cast(n, dt, "fp32", w, ub_in[0]), cast(n, dt, "fp32", sq, ub_in[1]),
                   vop("add", n, "fp32", w, w, sq), cast(n, "fp32", dt, s_ub, w)]
        else:
            w = s_ub
            ops = [vop("add", n, dt, s_ub, ub_in[0], ub_in[1])]
        rms = _rms_ops if r.hp <= MERGE_MAX_COLS else _rms_ops_long
        ops += rms(nr, r, w, w if dt != "fp32" else y_ub, sq, st, w32(consts, 0), p.eps)
        return ops + ([cast(n, "fp32", dt, y_ub, w)] if dt != "fp32" else [])

    k = row_kernel("add_rms_norm", r, hw, r.rows, [r.stream(x), r.stream(res)],
                         [r.stream(s_out), r.stream(y)], compute, consts=[g_const], tmp_row_bytes=parts,
                         setup=setup, quantum=quantum(hw, r.rows, r.h * r.e),
                         wide=lambda: wide_rms_norm("add_rms_norm", hw, r.rows, r.h, dt, r.e, x, gamma, y,
                                                    residual=res, x_sum=s_out))
    return vector_lowered("add_rms_norm", p, [k], 5 * r.rows * r.h + 3 * r.rows,
                    [TensorInfo("x", p.shape, dt), TensorInfo("residual", p.shape, dt),
                     TensorInfo("gamma", (r.h,), dt)],
                    [TensorInfo("x_sum", p.shape, dt), TensorInfo("y", p.shape, dt)])


@register("layer_norm", NormParams, reference=reference_layer_norm, ins=("x", "gamma", "beta"), outs=("y",))
def lower_layer_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dim."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    g_const, gamma = _weight(gm, "gamma", r, p.dtype)
    b_const, beta = _weight(gm, "beta", r, p.dtype)
    y = gm.tensor("y", r.rows * r.h * r.e)
    up = p.dtype != "fp32"
    setup, w32 = _weight_setup(r, p.dtype, 2)
    parts = ([r.f32_pitch] if up else []) + [r.f32_pitch, 4, 4]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        w = tmp[0] if up else ub_in[0]
        sq, mean, rstd = tmp[-3], tmp[-2], tmp[-1]
        dst = w if up else ub_out[0]
        g, b = w32(consts, 0), w32(consts, 1)
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += [vop("reduce_sum", n, "fp32", mean, w, out_n=nr), vop("muls", nr, "fp32", mean, mean)]
        ops += scalar_read()
        ops += per_row(nr, r.f32_pitch, lambda at: [vop("adds", r.hp, "fp32", at(w), at(w))])
        ops += [vop("mul", n, "fp32", sq, w, w), vop("reduce_sum", n, "fp32", rstd, sq, out_n=nr),
                vop("muls", nr, "fp32", rstd, rstd), vop("adds", nr, "fp32", rstd, rstd),
                vop("rsqrt", nr, "fp32", rstd, rstd)]
        ops += scalar_read()
        ops += per_row(nr, r.f32_pitch, lambda at: [vop("muls", r.hp, "fp32", at(w), at(w)),
                                                     vop("mul", r.hp, "fp32", at(w), at(w), g),
                                                     vop("add", r.hp, "fp32", at(dst), at(w), b)])
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("layer_norm", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                         consts=[g_const, b_const], tmp_row_bytes=parts, setup=setup,
                         quantum=quantum(hw, r.rows, r.h * r.e),
                         wide=lambda: wide_layer_norm(hw, r.rows, r.h, p.dtype, r.e, x, gamma, beta, y))
    # per element: sum, - mean, square, sum, * rstd, * gamma, + beta; per row: / h (twice), + eps, rsqrt
    return vector_lowered("layer_norm", p, [k], 7 * r.rows * r.h + 4 * r.rows,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("gamma", (r.h,), p.dtype),
                     TensorInfo("beta", (r.h,), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])


@register("softmax", SoftmaxParams, reference=reference_softmax, ins=("x",), outs=("y",))
def lower_softmax(p: SoftmaxParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Softmax over one dim: y = exp(x - max) / sum(exp(x - max)). Over the last dim (or
    one followed only by dims of 1) a row at a time; over another, npusim.ops.softmax_axis."""
    d = p.dim % len(p.shape)
    reduced, inner = p.shape[d], numel(p.shape[d + 1:])
    if inner > 1 and reduced > 1:
        e = DTYPE_BYTES[p.dtype]
        x = gm.tensor("x", numel(p.shape) * e)
        y = gm.tensor("y", numel(p.shape) * e)
        k = softmax_axis_kernel(hw, numel(p.shape[:d]), reduced, inner, p.dtype, e, x, y)
        # per element: max, - max, exp, sum, * (1/sum); per column: 1/sum
        return vector_lowered("softmax", p, [k], 5 * numel(p.shape) + numel(p.shape) // reduced,
                              [TensorInfo("x", p.shape, p.dtype)], [TensorInfo("y", p.shape, p.dtype)])
    r = _rows((numel(p.shape) // reduced, reduced), p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    y = gm.tensor("y", r.rows * r.h * r.e)
    up = p.dtype != "fp32"
    parts = ([r.f32_pitch] if up else []) + [4, 4]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        w = tmp[0] if up else ub_in[0]
        mx, sm = tmp[-2], tmp[-1]
        dst = w if up else ub_out[0]

        def row(at) -> list:
            """One row: its max, x - max, exp, its sum, * 1 / sum; each statistic read back
            by the scalar unit (GetValue) for the next instruction's scalar operand."""
            return ([vop("reduce_max", r.hp, "fp32", mx, at(w), out_n=1)] + scalar_read()
                    + [vop("adds", r.hp, "fp32", at(w), at(w)), vop("exp", r.hp, "fp32", at(w), at(w)),
                       vop("reduce_sum", r.hp, "fp32", sm, at(w), out_n=1)] + scalar_read()
                    + [vop("muls", r.hp, "fp32", at(dst), at(w))])

        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += per_row(nr, r.f32_pitch, row)
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("softmax", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                         tmp_row_bytes=parts, quantum=quantum(hw, r.rows, r.h * r.e),
                         wide=lambda: wide_softmax(hw, r.rows, r.h, p.dtype, r.e, x, y))
    # per element: max, - max, exp, sum, * (1/sum); per row: 1/sum
    return vector_lowered("softmax", p, [k], 5 * r.rows * r.h + r.rows,
                    [TensorInfo("x", p.shape, p.dtype)], [TensorInfo("y", p.shape, p.dtype)])


def rope_head_dim_step(dtype: str) -> int:
    """What rope's head_dim must be a multiple of: each half head a whole number of
    UB_BLOCK-byte blocks at the dtype it is computed in (bf16 in fp32): fp16 32, bf16 16."""
    return 2 * UB_BLOCK // (4 if dtype == "bf16" else DTYPE_BYTES[dtype])


@register("rope", RopeParams, reference=reference_rope, ins=("x", "cos", "sin"), outs=("y",))
def lower_rope(p: RopeParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Rotary embedding (rotate-half form): y = x * cos + rotate_half(x) * sin."""
    # rotate_half(x) = [-x2, x1] per head. cos and sin are [tokens, head_dim] (already
    # gathered at each token's position), shared by every head. To rotate q and k in
    # one kernel, pass heads = q_heads + k_heads (they sit side by side in the QKV
    # projection's output). Per tile of nr tokens: the halves are swapped by two
    # strided instructions over the whole tile; x*cos and rot*sin are one instruction
    # per head (token stride heads*head_dim, cos/sin rows reused by every head).
    tokens, heads, d = p.shape
    e = DTYPE_BYTES[p.dtype]
    ce = 4 if p.dtype == "bf16" else e
    if d % rope_head_dim_step(p.dtype):
        raise ProgramError(f"op rope: shape[-1]={d} (head_dim) must make a half head a multiple of "
                           f"{UB_BLOCK} bytes in {'fp32' if ce == 4 else p.dtype} (UB operand alignment)")
    row = heads * d
    x = gm.tensor("x", tokens * row * e)
    cos = gm.tensor("cos", tokens * d * e)
    sin = gm.tensor("sin", tokens * d * e)
    y = gm.tensor("y", tokens * row * e)
    bf = p.dtype == "bf16"
    parts = [row * ce] + ([row * 4, d * 4, d * 4, row * 4] if bf else [])
    half = d // 2

    def compute(nr, ub_in, ub_out, tmp, consts):
        n, nd = nr * row, nr * d
        t = tmp[0]
        ops = []
        if bf:
            xs, cs, ss, acc = tmp[1], tmp[2], tmp[3], tmp[4]
            ops += [cast(n, "bf16", "fp32", xs, ub_in[0]), cast(nd, "bf16", "fp32", cs, ub_in[1]),
                    cast(nd, "bf16", "fp32", ss, ub_in[2])]
        else:
            xs, cs, ss, acc = ub_in[0], ub_in[1], ub_in[2], ub_out[0]
        cdt = "fp32" if bf else p.dtype
        halves = ((nr * heads, d * ce, d * ce),)  # one half head per token and head
        per_head = ((nr, row * ce, row * ce, d * ce),)  # head h of each token times that token's cos / sin row
        ops += [vop("muls", n // 2, cdt, t, xs + half * ce, scalar=-1.0, pitches=halves),
                vop("copy", n // 2, cdt, t + half * ce, xs, flops=0, pitches=halves)]
        ops += [Loop("h", heads, [vop("mul", nd, cdt, addr(acc, h=d * ce), addr(xs, h=d * ce), cs, pitches=per_head)])]
        ops += [Loop("h", heads, [vop("mul", nd, cdt, addr(t, h=d * ce), addr(t, h=d * ce), ss, pitches=per_head)])]
        ops += [vop("add", n, cdt, acc, acc, t)]
        return ops + ([cast(n, "fp32", "bf16", ub_out[0], acc)] if bf else [])

    # not tiled along heads (yet): a token's heads * head_dim must fit UB, else the error names them
    k = row_kernel("rope", _Rows(tokens, row, e, row * e, row, ()), hw, tokens,
                   [Stream(x, row * e), Stream(cos, d * e), Stream(sin, d * e)], [Stream(y, row * e)], compute,
                   tmp_row_bytes=parts, quantum=quantum(hw, tokens, row * e))
    n = tokens * row
    # per element: * cos, * sin, + ; half of them negated
    return vector_lowered("rope", p, [k], 3 * n + n // 2,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("cos", (tokens, d), p.dtype),
                     TensorInfo("sin", (tokens, d), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])
