"""Vector (AIV) operators: elementwise, row-wise (norms, softmax, RoPE) and sampling.

Every op here is one `streaming_kernel` (argmax and top-k sampling: two, a split
reduction): a core streams its rows through UB double-buffered, and V runs the
op's instruction sequence on each tile. The sequences are what an Ascend C
author writes, and they are what the op costs:

- fp16 and fp32 arithmetic runs in the input dtype. bf16 has no vector
  arithmetic on this chip (only casts), so bf16 ops cast in to fp32 and back.
  # assumption: 910B vector ALU ops take fp16/fp32 (and int), not bf16
- norms and softmax compute in fp32 whatever the input (cast in, cast out), as
  CANN's kernels do for accuracy; a row reduction is one reduce instruction over
  the tile (out_n = one value per row), and applying a per-row statistic is one
  instruction per row with the statistic as a scalar operand, read back by the
  scalar unit (a V -> S -> V round trip per tile, like GetValue + Muls).
- rows are kept whole in UB (the hidden size of a norm, the width of a softmax):
  a row that cannot fit twice over plus its scratch is an error naming UB and
  the bytes. Rows whose bytes are not a multiple of 32 are padded to 32 bytes in
  UB (DataCopyPad: a tile then moves one DMA segment per row).
- analytic FLOPs count the arithmetic vector ops per element a minimal
  implementation needs (casts and copies are not counted); the roofline prices
  them all at the vector add rate, so ops heavy in exp/div sit further above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Loop, Pipe, SetFlag, VecOp, WaitFlag, addr
from npusim.ops.build import align_up, cdiv, line_quantum
from npusim.ops.reference import eltwise, gated, gelu, silu, softmax_rows
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Const, Stream, streaming_kernel

FLOAT_DTYPES = ("fp16", "bf16", "fp32")
CAST_DTYPES = ("fp16", "bf16", "fp32", "int8", "int32")
UB_BLOCK = 32  # bytes: UB addresses of vector operands are 32-byte aligned


def shape_validator(ndim: int | None = None, min_ndim: int = 1):
    """A tuple of positive ints, with exactly `ndim` (or at least `min_ndim`) dims."""

    def check(instance, attribute, value) -> None:
        if not isinstance(value, tuple) or not all(isinstance(d, int) and d > 0 for d in value):
            raise ValueError(f"'{attribute.name}' must be a tuple of positive ints, got {value!r}")
        if ndim is not None and len(value) != ndim:
            raise ValueError(f"'{attribute.name}' must have {ndim} dims, got {value!r}")
        if len(value) < min_ndim:
            raise ValueError(f"'{attribute.name}' must have at least {min_ndim} dims, got {value!r}")

    return check


def one_of(choices: Sequence[str]):
    """Like attrs' in_, with a one-line message (in_ packs the attribute into the error)."""

    def check(instance, attribute, value) -> None:
        if value not in choices:
            raise ValueError(f"'{attribute.name}' must be one of {', '.join(choices)}, got {value!r}")

    return check


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _dtype(choices=FLOAT_DTYPES):
    return one_of(choices)


def _lowered(op: str, p, kernels, flops: float, ins: list[TensorInfo], outs: list[TensorInfo],
             workspace_bytes: int = 0) -> Lowered:
    return Lowered(
        op_type=op, params=p, tiling=None, kernels=kernels, flops=float(flops),
        min_gm_bytes=float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)),
        unit="vector", inputs=ins, outputs=outs, workspace_bytes=workspace_bytes,
    )


def quantum(hw: HwConfig, rows: int, pitch: int, fallback: int = 1) -> int:
    """Rows per core come in multiples of this: whole L2 lines per core when there are
    rows enough for every core to get several lines (identical blocks, no line shared
    between cores), else `fallback` (whole DMA bursts for elementwise streams)."""
    q = line_quantum(hw, pitch)
    return q if rows >= 4 * q * hw.aiv_count else fallback


def scalar_read() -> list:
    """The scalar unit reads per-row statistics V has just computed (GetValue): V -> S -> V."""
    return [SetFlag(Pipe.V, Pipe.S, 0), WaitFlag(Pipe.V, Pipe.S, 0),
            SetFlag(Pipe.S, Pipe.V, 0), WaitFlag(Pipe.S, Pipe.V, 0)]


def vop(op: str, n: int, dtype: str, dst, *srcs, out_dtype: str | None = None, out_n: int | None = None,
        flops: int = 1) -> VecOp:
    return VecOp(op, n, dtype, dst, tuple(srcs), out_dtype, out_n, flops)


def cast(n: int, src_dtype: str, dst_dtype: str, dst, src) -> VecOp:
    return VecOp("cast", n, src_dtype, dst, (src,), dst_dtype, None, 0)


# ================================================================ elementwise


@frozen
class EltwiseParams:
    shape: tuple = param((8, 4096), "tensor shape (every input and the output)", validator=shape_validator())
    dtype: str = param("fp16", "element dtype", validator=_dtype())


@frozen
class ScaleParams(EltwiseParams):
    scale: float = param(0.5, "the scalar s")


@frozen
class CastParams:
    shape: tuple = param((8, 4096), "tensor shape", validator=shape_validator())
    dtype: str = param("fp16", "input dtype", validator=_dtype(CAST_DTYPES))
    out_dtype: str = param("fp32", "output dtype", validator=_dtype(CAST_DTYPES))


@frozen
class SwigluParams:
    shape: tuple = param((8, 16896), "input shape [.., 2h]: gate in [.., :h], up in [.., h:]",
                         validator=shape_validator())
    dtype: str = param("fp16", "element dtype", validator=_dtype())


# body(n, UB srcs, UB dst, UB temps, compute dtype) -> vector instructions
Body = Callable[[int, Sequence[int], int, Sequence[int], str], list]


def _eltwise_kernel(op: str, hw: HwConfig, dtype: str, rows: int, ins: list[Stream], out: Stream,
                    row_elems: int, body: Body, n_tmp: int, quantum_: int):
    """A streaming kernel applying `body` to whole tiles. row_elems: elements of a row
    as laid out in UB (1 for a plain elementwise op, the padded half row for SwiGLU).
    bf16 casts every input to an fp32 scratch, runs `body` in fp32 and casts back."""
    if dtype == "bf16":
        parts = [row_elems * 4] * (len(ins) + 1 + n_tmp)

        def compute(nr, ub_in, ub_out, tmp, consts):
            n = nr * row_elems
            ops = [cast(n, "bf16", "fp32", tmp[i], ub) for i, ub in enumerate(ub_in)]
            ops += body(n, tmp[:len(ins)], tmp[len(ins)], tmp[len(ins) + 1:], "fp32")
            return ops + [cast(n, "fp32", "bf16", ub_out[0], tmp[len(ins)])]
    else:
        parts = [row_elems * DTYPE_BYTES[dtype]] * n_tmp

        def compute(nr, ub_in, ub_out, tmp, consts):
            return body(nr * row_elems, ub_in, ub_out[0], tmp, dtype)

    return streaming_kernel(op, op, hw, rows, ins, [out], compute, tmp_row_bytes=parts, quantum=quantum_)


def _eltwise(op: str, p, hw: HwConfig, gm: GmArena, in_names: Sequence[str], body: Body, flops_per_elem: int,
             n_tmp: int = 0) -> Lowered:
    n, e = numel(p.shape), DTYPE_BYTES[p.dtype]
    tensors = [gm.tensor(name, n * e) for name in in_names]
    y = gm.tensor("y", n * e)
    q = quantum(hw, n, e, fallback=max(1, hw.dma.burst_bytes // e))
    k = _eltwise_kernel(op, hw, p.dtype, n, [Stream(t, e) for t in tensors], Stream(y, e), 1, body, n_tmp, q)
    return _lowered(op, p, [k], flops_per_elem * n, [TensorInfo(name, p.shape, p.dtype) for name in in_names],
                    [TensorInfo("y", p.shape, p.dtype)])


@register("add", EltwiseParams, reference=eltwise(lambda p, a, b: a + b, "x1", "x2"), in_place=True,
          ins=("x1", "x2"), outs=("y",))
def lower_add(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Elementwise add: y = x1 + x2."""
    return _eltwise("add", p, hw, gm, ("x1", "x2"), lambda n, s, d, t, dt: [vop("add", n, dt, d, s[0], s[1])], 1)


@register("mul", EltwiseParams, reference=eltwise(lambda p, a, b: a * b, "x1", "x2"), in_place=True,
          ins=("x1", "x2"), outs=("y",))
def lower_mul(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Elementwise multiply: y = x1 * x2."""
    return _eltwise("mul", p, hw, gm, ("x1", "x2"), lambda n, s, d, t, dt: [vop("mul", n, dt, d, s[0], s[1])], 1)


@register("relu", EltwiseParams, reference=eltwise(lambda p, a: np.maximum(a, 0), "x"), in_place=True,
          ins=("x",), outs=("y",))
def lower_relu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """ReLU: y = max(x, 0)."""
    return _eltwise("relu", p, hw, gm, ("x",), lambda n, s, d, t, dt: [vop("relu", n, dt, d, s[0])], 1)


@register("scale", ScaleParams, reference=eltwise(lambda p, a: a * np.float32(p.scale), "x"), in_place=True,
          ins=("x",), outs=("y",))
def lower_scale(p: ScaleParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Multiply by a scalar: y = x * s (Muls)."""
    return _eltwise("scale", p, hw, gm, ("x",), lambda n, s, d, t, dt: [vop("muls", n, dt, d, s[0])], 1)


@register("scale_add", ScaleParams, reference=eltwise(lambda p, a, r: a * np.float32(p.scale) + r, "x", "r"),
          in_place=True, ins=("x", "r"), outs=("y",))
def lower_scale_add(p: ScaleParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Scale and add: y = x * s + r (Muls then Add)."""
    return _eltwise("scale_add", p, hw, gm, ("x", "r"),
                    lambda n, s, d, t, dt: [vop("muls", n, dt, d, s[0]), vop("add", n, dt, d, d, s[1])], 2)


def silu_ops(n: int, x, dst, t, dt: str) -> list:
    """silu(x) = x / (1 + exp(-x)): Muls(-1), Exp, Adds(1), Div - 4 ops per element."""
    return [vop("muls", n, dt, t, x), vop("exp", n, dt, t, t), vop("adds", n, dt, t, t), vop("div", n, dt, dst, x, t)]


@register("silu", EltwiseParams, reference=eltwise(lambda p, a: silu(a), "x"), in_place=True, ins=("x",),
          outs=("y",))
def lower_silu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """SiLU: y = x * sigmoid(x), as x / (1 + exp(-x))."""
    return _eltwise("silu", p, hw, gm, ("x",), lambda n, s, d, t, dt: silu_ops(n, s[0], d, t[0], dt), 4, n_tmp=1)


@register("gelu", EltwiseParams, reference=eltwise(lambda p, a: gelu(a), "x"), in_place=True, ins=("x",),
          outs=("y",))
def lower_gelu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """GELU (tanh form): y = x / (1 + exp(-2c(x + 0.044715 x^3))), c = sqrt(2/pi)."""

    # 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)); the polynomial in Horner form:
    # t = x*x; t = t * (-2c*0.044715) + (-2c); t = t * x; exp; +1; x / t  -> 7 ops
    def body(n, s, d, t, dt):
        x, u = s[0], t[0]
        return [vop("mul", n, dt, u, x, x), vop("muls", n, dt, u, u), vop("adds", n, dt, u, u),
                vop("mul", n, dt, u, u, x), vop("exp", n, dt, u, u), vop("adds", n, dt, u, u),
                vop("div", n, dt, d, x, u)]

    return _eltwise("gelu", p, hw, gm, ("x",), body, 7, n_tmp=1)


@register("swiglu", SwigluParams, reference=gated(silu), ins=("x",), outs=("y",))
def lower_swiglu(p: SwigluParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """SwiGLU: y = silu(gate) * up, gate and up the two halves of one [.., 2h] input."""
    # One [.., 2h] input, as the fused gate_up projection writes it (torch_npu
    # npu_swiglu takes the same): a tile reads the gate halves and the up halves of
    # its rows as two strided streams (one DMA segment per row each).
    *lead, two_h = p.shape
    if two_h % 2:
        raise ProgramError(f"op swiglu: shape[-1]={two_h} must be even (gate and up halves)")
    h, e = two_h // 2, DTYPE_BYTES[p.dtype]
    rows = numel(lead) if lead else 1
    x = gm.tensor("x", rows * two_h * e)
    y = gm.tensor("y", rows * h * e)
    pitch = align_up(h * e, UB_BLOCK)
    ub = pitch if pitch != h * e else 0
    gate = Stream(x, h * e, 0, two_h * e, ub)
    up = Stream(x, h * e, h * e, two_h * e, ub)
    out = Stream(y, h * e, 0, 0, ub)

    q = quantum(hw, rows, two_h * e)
    if p.dtype == "bf16":  # two fp32 scratch rows, not three: silu(gate) in place, then up
        hp = pitch // e

        def compute(nr, ub_in, ub_out, tmp, consts):
            n, (a, b) = nr * hp, tmp
            return ([cast(n, "bf16", "fp32", a, ub_in[0])] + silu_ops(n, a, a, b, "fp32")
                    + [cast(n, "bf16", "fp32", b, ub_in[1]), vop("mul", n, "fp32", a, a, b),
                       cast(n, "fp32", "bf16", ub_out[0], a)])

        k = streaming_kernel("swiglu", "swiglu", hw, rows, [gate, up], [out], compute,
                             tmp_row_bytes=[hp * 4, hp * 4], quantum=q)
    else:
        def body(n, s, d, t, dt):
            return silu_ops(n, s[0], t[0], t[0], dt) + [vop("mul", n, dt, d, t[0], s[1])]

        k = _eltwise_kernel("swiglu", hw, p.dtype, rows, [gate, up], out, pitch // e, body, 1, q)
    return _lowered("swiglu", p, [k], 5 * rows * h, [TensorInfo("x", p.shape, p.dtype)],
                    [TensorInfo("y", (*lead, h), p.dtype)])


@register("cast", CastParams, reference=eltwise(lambda p, a: a, "x"), in_place=True, ins=("x",), outs=("y",))
def lower_cast(p: CastParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Convert dtype: y = cast(x) (one Cast instruction per tile)."""
    if p.dtype == p.out_dtype:
        raise ProgramError(f"op cast: dtype and out_dtype are both {p.dtype}: nothing to convert")
    n, ei, eo = numel(p.shape), DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    x, y = gm.tensor("x", n * ei), gm.tensor("y", n * eo)

    def compute(nr, ub_in, ub_out, tmp, consts):  # here the conversion is the op's work: counted
        return [vop("cast", nr, p.dtype, ub_out[0], ub_in[0], out_dtype=p.out_dtype)]

    q = quantum(hw, n, min(ei, eo), fallback=max(1, hw.dma.burst_bytes // min(ei, eo)))
    k = streaming_kernel("cast", "cast", hw, n, [Stream(x, ei)], [Stream(y, eo)], compute, quantum=q)
    return _lowered("cast", p, [k], n, [TensorInfo("x", p.shape, p.dtype)], [TensorInfo("y", p.shape, p.out_dtype)])


# ================================================================ row-wise


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
    return {"y": softmax_rows(x["x"].reshape(-1, p.shape[-1]))}


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
    dtype: str = param("fp16", "dtype of x, the weights and y", validator=_dtype())
    eps: float = param(1e-6, "added to the variance")


@frozen
class SoftmaxParams:
    shape: tuple = param((8, 4096), "input shape [.., cols]; softmax over the last dim", validator=shape_validator())
    dtype: str = param("fp16", "dtype of x and y", validator=_dtype())


@frozen
class RopeParams:
    shape: tuple = param((8, 32, 128), "q or k: [tokens, heads, head_dim]", validator=shape_validator(ndim=3))
    dtype: str = param("fp16", "dtype of x, cos, sin and y", validator=_dtype())


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


def row_kernel(op: str, r: _Rows, *args, **kw):
    """streaming_kernel for whole rows; a row too long for UB names the parameter."""
    try:
        return streaming_kernel(op, op, *args, **kw)
    except ProgramError as err:
        raise ProgramError(f"{err}: shape[-1]={r.h} is too long to keep a row whole in UB") from None


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


def _per_row(nr: int, pitch: int, ops: Callable[[Callable[[int], object]], list]) -> list:
    """One instruction (or a few) per row of the tile: ops(at) gets at(base) = base + r * pitch."""
    return [Loop("r", nr, ops(lambda base: addr(base, r=pitch)))]


def _rms_ops(nr: int, r: _Rows, w, dst, sq, st, gamma32) -> list:
    """rstd = rsqrt(mean(w^2) + eps); dst = w * rstd * gamma (w, dst fp32 [nr, hp])."""
    n = nr * r.hp
    ops = [vop("mul", n, "fp32", sq, w, w),
           vop("reduce_sum", n, "fp32", st, sq, out_n=nr),
           vop("muls", nr, "fp32", st, st), vop("adds", nr, "fp32", st, st), vop("rsqrt", nr, "fp32", st, st)]
    ops += scalar_read()
    ops += _per_row(nr, r.f32_pitch, lambda at: [vop("muls", r.hp, "fp32", at(dst), at(w)),
                                                 vop("mul", r.hp, "fp32", at(dst), at(dst), gamma32)])
    return ops


@register("rms_norm", NormParams, reference=reference_rms_norm, ins=("x", "gamma"), outs=("y",))
def lower_rms_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma, over the last dim."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    g_const, _ = _weight(gm, "gamma", r, p.dtype)
    y = gm.tensor("y", r.rows * r.h * r.e)
    up = p.dtype != "fp32"
    setup, w32 = _weight_setup(r, p.dtype, 1)
    parts = ([r.f32_pitch] if up else []) + [r.f32_pitch, 4]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        w = tmp[0] if up else ub_in[0]
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += _rms_ops(nr, r, w, w if up else ub_out[0], tmp[-2], tmp[-1], w32(consts, 0))
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("rms_norm", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                         consts=[g_const], tmp_row_bytes=parts, setup=setup, quantum=quantum(hw, r.rows, r.h * r.e))
    # per element: square, sum, * rstd, * gamma; per row: / h, + eps, rsqrt
    return _lowered("rms_norm", p, [k], 4 * r.rows * r.h + 3 * r.rows,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("gamma", (r.h,), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])


@register("add_rms_norm", NormParams, reference=reference_add_rms_norm, ins=("x", "residual", "gamma"),
          outs=("x_sum", "y"))
def lower_add_rms_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Residual add + RMSNorm: s = x + residual; y = rms_norm(s) * gamma; outputs s and y."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    res = gm.tensor("residual", r.rows * r.h * r.e)
    g_const, _ = _weight(gm, "gamma", r, p.dtype)
    s_out = gm.tensor("x_sum", r.rows * r.h * r.e)
    y = gm.tensor("y", r.rows * r.h * r.e)
    setup, w32 = _weight_setup(r, p.dtype, 1)
    dt = p.dtype
    # fp16: s = x + r in fp16 (exactly what the unfused Add gives), then normalise its
    # fp32 cast; bf16: cast both, add in fp32, cast s back; fp32: normalise s itself.
    parts = ([r.f32_pitch] if dt != "fp32" else []) + [r.f32_pitch, 4]

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
        ops += _rms_ops(nr, r, w, w if dt != "fp32" else y_ub, sq, st, w32(consts, 0))
        return ops + ([cast(n, "fp32", dt, y_ub, w)] if dt != "fp32" else [])

    k = row_kernel("add_rms_norm", r, hw, r.rows, [r.stream(x), r.stream(res)],
                         [r.stream(s_out), r.stream(y)], compute, consts=[g_const], tmp_row_bytes=parts,
                         setup=setup, quantum=quantum(hw, r.rows, r.h * r.e))
    return _lowered("add_rms_norm", p, [k], 5 * r.rows * r.h + 3 * r.rows,
                    [TensorInfo("x", p.shape, dt), TensorInfo("residual", p.shape, dt),
                     TensorInfo("gamma", (r.h,), dt)],
                    [TensorInfo("x_sum", p.shape, dt), TensorInfo("y", p.shape, dt)])


@register("layer_norm", NormParams, reference=reference_layer_norm, ins=("x", "gamma", "beta"), outs=("y",))
def lower_layer_norm(p: NormParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta, over the last dim."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    g_const, _ = _weight(gm, "gamma", r, p.dtype)
    b_const, _ = _weight(gm, "beta", r, p.dtype)
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
        ops += _per_row(nr, r.f32_pitch, lambda at: [vop("adds", r.hp, "fp32", at(w), at(w))])
        ops += [vop("mul", n, "fp32", sq, w, w), vop("reduce_sum", n, "fp32", rstd, sq, out_n=nr),
                vop("muls", nr, "fp32", rstd, rstd), vop("adds", nr, "fp32", rstd, rstd),
                vop("rsqrt", nr, "fp32", rstd, rstd)]
        ops += scalar_read()
        ops += _per_row(nr, r.f32_pitch, lambda at: [vop("muls", r.hp, "fp32", at(w), at(w)),
                                                     vop("mul", r.hp, "fp32", at(w), at(w), g),
                                                     vop("add", r.hp, "fp32", at(dst), at(w), b)])
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("layer_norm", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                         consts=[g_const, b_const], tmp_row_bytes=parts, setup=setup,
                         quantum=quantum(hw, r.rows, r.h * r.e))
    # per element: sum, - mean, square, sum, * rstd, * gamma, + beta; per row: / h (twice), + eps, rsqrt
    return _lowered("layer_norm", p, [k], 7 * r.rows * r.h + 4 * r.rows,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("gamma", (r.h,), p.dtype),
                     TensorInfo("beta", (r.h,), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])


@register("softmax", SoftmaxParams, reference=reference_softmax, ins=("x",), outs=("y",))
def lower_softmax(p: SoftmaxParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Softmax over the last dim: y = exp(x - max) / sum(exp(x - max))."""
    r = _rows(p.shape, p.dtype)
    x = gm.tensor("x", r.rows * r.h * r.e)
    y = gm.tensor("y", r.rows * r.h * r.e)
    up = p.dtype != "fp32"
    parts = ([r.f32_pitch] if up else []) + [4, 4]

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * r.hp
        w = tmp[0] if up else ub_in[0]
        mx, sm = tmp[-2], tmp[-1]
        dst = w if up else ub_out[0]
        ops = [cast(n, p.dtype, "fp32", w, ub_in[0])] if up else []
        ops += [vop("reduce_max", n, "fp32", mx, w, out_n=nr)]
        ops += scalar_read()
        ops += _per_row(nr, r.f32_pitch, lambda at: [vop("adds", r.hp, "fp32", at(w), at(w))])
        ops += [vop("exp", n, "fp32", w, w), vop("reduce_sum", n, "fp32", sm, w, out_n=nr),
                vop("div", nr, "fp32", sm, sm, sm)]  # 1 / sum, then one multiply per element
        ops += scalar_read()
        ops += _per_row(nr, r.f32_pitch, lambda at: [vop("muls", r.hp, "fp32", at(dst), at(w))])
        return ops + ([cast(n, "fp32", p.dtype, ub_out[0], w)] if up else [])

    k = row_kernel("softmax", r, hw, r.rows, [r.stream(x)], [r.stream(y)], compute,
                         tmp_row_bytes=parts, quantum=quantum(hw, r.rows, r.h * r.e))
    # per element: max, - max, exp, sum, * (1/sum); per row: 1/sum
    return _lowered("softmax", p, [k], 5 * r.rows * r.h + r.rows,
                    [TensorInfo("x", p.shape, p.dtype)], [TensorInfo("y", p.shape, p.dtype)])


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
    if d % 2 or (d // 2 * ce) % UB_BLOCK:
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
        ops += [vop("muls", n // 2, cdt, t, xs + half * ce), vop("copy", n // 2, cdt, t + half * ce, xs, flops=0)]
        ops += [Loop("h", heads, [vop("mul", nd, cdt, addr(acc, h=d * ce), addr(xs, h=d * ce), cs)])]
        ops += [Loop("h", heads, [vop("mul", nd, cdt, addr(t, h=d * ce), addr(t, h=d * ce), ss)])]
        ops += [vop("add", n, cdt, acc, acc, t)]
        return ops + ([cast(n, "fp32", "bf16", ub_out[0], acc)] if bf else [])

    k = streaming_kernel("rope", "rope", hw, tokens, [Stream(x, row * e), Stream(cos, d * e), Stream(sin, d * e)],
                         [Stream(y, row * e)], compute, tmp_row_bytes=parts, quantum=quantum(hw, tokens, row * e))
    n = tokens * row
    # per element: * cos, * sin, + ; half of them negated
    return _lowered("rope", p, [k], 3 * n + n // 2,
                    [TensorInfo("x", p.shape, p.dtype), TensorInfo("cos", (tokens, d), p.dtype),
                     TensorInfo("sin", (tokens, d), p.dtype)],
                    [TensorInfo("y", p.shape, p.dtype)])


# ================================================================ sampling


def reference_argmax(p, x, specs, ctx) -> dict:
    return {"index": np.argmax(x["logits"].reshape(-1, p.shape[-1]), axis=-1).astype(np.int32)}


def reference_top_k(p, x, specs, ctx) -> dict:
    """The exponential race over each row's k largest logits: argmax_i exp(v_i - v_max) / q_i
    with q = noise [.., k] (Exp(1) draws), i over the top k in descending order."""
    logits = x["logits"].reshape(-1, p.shape[-1])
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :p.k]
    v = np.take_along_axis(logits, top, axis=-1)
    race = np.exp(v - v[:, :1]) / x["noise"].reshape(-1, p.k)
    return {"token": np.take_along_axis(top, np.argmax(race, axis=-1)[:, None], axis=-1)[:, 0].astype(np.int32)}

# A [batch, vocab] row is usually too long for one core to be quick (and batch is
# smaller than the core count), so both ops split each row into `parts` chunks:
# kernel 1 reduces every chunk to a partial record in a GM workspace, kernel 2
# combines each row's partials. Chunks are a divisor of the vocab so they never
# straddle rows.

RECORD_BYTES = 32  # an argmax partial: (value, index) padded to one 32-byte block
MIN_CHUNK_BYTES = 4096  # assumed: a shorter chunk costs more in start-ups than it saves


@frozen
class ArgmaxParams:
    shape: tuple = param((8, 64000), "logits [.., vocab]; the argmax is over the last dim",
                         validator=shape_validator())
    dtype: str = param("fp16", "dtype of the logits", validator=_dtype())


@frozen
class TopKParams:
    shape: tuple = param((8, 64000), "logits [.., vocab]", validator=shape_validator())
    dtype: str = param("fp16", "dtype of the logits", validator=_dtype())
    k: int = param(50, "candidates kept per row", validator=validators.gt(0))


def _split_vocab(op: str, hw: HwConfig, rows: int, vocab: int, e: int, ub_per_elem: int, ub_fixed: int,
                 min_chunk: int = 1) -> int:
    """Chunks per row: the fewest (a divisor of vocab) that give every AIV a chunk and
    whose UB need (ub_per_elem bytes per element + ub_fixed) fits; else the most that
    fit. A chunk is never shorter than min_chunk elements (nor than a few KiB: shorter
    ones are not worth a core)."""
    budget = hw.aiv.ub_bytes - 1024  # alignment slack of the buffers
    shortest = max(min_chunk, MIN_CHUNK_BYTES // e)

    def fits(p: int) -> bool:
        return align_up(vocab // p * e, UB_BLOCK) // e * ub_per_elem + ub_fixed <= budget

    want = cdiv(hw.aiv_count, rows)
    ok = [p for p in range(1, vocab + 1)
          if vocab % p == 0 and (p == 1 or vocab // p >= shortest) and fits(p)]
    if not ok:
        raise ProgramError(f"op {op}: shape[-1]={vocab} has no divisor that makes a chunk fit UB "
                           f"({hw.aiv.ub_bytes} bytes at {ub_per_elem} bytes per element)")
    enough = [p for p in ok if p >= want]
    return min(enough) if enough else max(ok)


@register("argmax", ArgmaxParams, reference=reference_argmax, ins=("logits",), outs=("index",))
def lower_argmax(p: ArgmaxParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Greedy sampling: the index of each row's largest logit (int32)."""
    *lead, vocab = p.shape
    rows, e = (numel(lead) if lead else 1), DTYPE_BYTES[p.dtype]
    parts = _split_vocab("argmax", hw, rows, vocab, e, 2 * e, 2 * RECORD_BYTES)
    chunk = vocab // parts
    pitch = align_up(chunk * e, UB_BLOCK)
    x = gm.tensor("logits", rows * vocab * e)
    idx = gm.tensor("index", rows * 4)
    chunk_in = Stream(x, chunk * e, 0, 0, pitch if pitch != chunk * e else 0)

    if parts == 1:  # whole rows: one kernel
        def one(nr, ub_in, ub_out, tmp, consts):
            return [vop("reduce_max", nr * (pitch // e), p.dtype, tmp, ub_in[0], out_n=2 * nr),
                    vop("gather", nr, "int32", ub_out[0], tmp, flops=0)]

        k = streaming_kernel("argmax", "argmax", hw, rows, [chunk_in], [Stream(idx, 4)], one,
                             tmp_row_bytes=RECORD_BYTES)
        return _lowered("argmax", p, [k], rows * vocab, [TensorInfo("logits", p.shape, p.dtype)],
                        [TensorInfo("index", tuple(lead) or (1,), "int32")])

    units = rows * parts
    ws = gm.tensor("workspace", units * RECORD_BYTES)

    def partial(nr, ub_in, ub_out, tmp, consts):  # ReduceMax with its index, per chunk
        return [vop("reduce_max", nr * (pitch // e), p.dtype, ub_out[0], ub_in[0], out_n=2 * nr)]

    k1 = streaming_kernel("argmax_partial", "argmax", hw, units, [chunk_in], [Stream(ws, RECORD_BYTES)], partial,
                          quantum=quantum(hw, units, chunk * e))

    def combine(nr, ub_in, ub_out, tmp, consts):
        # the winning chunk's record, then index = chunk * chunk_len + local index
        best, local = tmp
        return [vop("reduce_max", nr * parts, p.dtype, best, ub_in[0], out_n=2 * nr),
                vop("gather", nr, "int32", local, ub_in[0], flops=0),
                vop("muls", nr, "int32", best, best), vop("add", nr, "int32", ub_out[0], best, local)]

    k2 = streaming_kernel("argmax_combine", "argmax", hw, rows, [Stream(ws, parts * RECORD_BYTES)],
                          [Stream(idx, 4)], combine, tmp_row_bytes=[RECORD_BYTES, 4], quantum=rows)
    return _lowered("argmax", p, [k1, k2], rows * vocab + rows * parts, [TensorInfo("logits", p.shape, p.dtype)],
                    [TensorInfo("index", tuple(lead) or (1,), "int32")], workspace_bytes=units * RECORD_BYTES)


def _merge_ops(nr: int, lists: int, length: int, k: int, pairs: int, src: int, dst: int) -> tuple[list, int]:
    """4-way merges (MrgSort4) of `lists` sorted lists of up to `length` pairs (`pairs`
    in all) per unit, each merged list cut to its best k, until one list remains.
    Returns (instructions, the buffer holding the result). A pair is 8 bytes (fp32
    value, uint32 index) = 2 fp32 slots; merges ping-pong between src and dst."""
    ops = []
    while lists > 1:
        pairs_in = min(pairs, lists * min(length, k))
        lists, length = cdiv(lists, 4), min(4 * length, k)
        pairs = min(pairs_in, lists * length)
        ops.append(vop("mrgsort", 2 * nr * pairs_in, "fp32", dst, src, out_n=2 * nr * pairs, flops=0))
        src, dst = dst, src
    return ops, src


@register("top_k", TopKParams, reference=reference_top_k, ins=("logits", "noise"), outs=("token",))
def lower_top_k(p: TopKParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Top-k sampling: draw one token per row from its k largest logits (int32)."""
    # Modelled: kernel 1 sorts each vocab chunk (Sort32 over groups of 32, then 4-way
    # MrgSort levels, every merged list cut to its best k) and writes the chunk's top
    # k (value, index) pairs to a workspace; kernel 2 merges a row's chunk lists down
    # to its top k, then draws by the exponential race (as vLLM does): token =
    # argmax_i exp(v_i - v_max) / q_i with q ~ Exp(1) from the `noise` input [.., k].
    *lead, vocab = p.shape
    rows, e, k = (numel(lead) if lead else 1), DTYPE_BYTES[p.dtype], p.k
    if k > vocab:
        raise ProgramError(f"op top_k: k={k} exceeds the vocabulary shape[-1]={vocab}")
    pair = 8
    out_pitch = align_up(k * pair, UB_BLOCK)
    # UB per element of a chunk: logits ping+pong, fp32 values, indices, pairs, merge scratch
    parts = _split_vocab("top_k", hw, rows, vocab, e, 2 * e + 4 + 4 + 2 * pair, 2 * out_pitch, min_chunk=k)
    chunk = vocab // parts
    if chunk < k:
        raise ProgramError(f"op top_k: k={k} is larger than a vocab chunk ({chunk} of shape[-1]={vocab})")
    pitch = align_up(chunk * e, UB_BLOCK)
    cp = pitch // e
    x = gm.tensor("logits", rows * vocab * e)
    noise = gm.tensor("noise", rows * k * 4)
    tok = gm.tensor("token", rows * 4)
    units = rows * parts
    ws = gm.tensor("workspace", units * k * pair)

    def chunk_topk(nr, ub_in, ub_out, tmp, consts):
        vals, ids, pa, pb = tmp
        n = nr * cp
        ops = [cast(n, p.dtype, "fp32", vals, ub_in[0])] if p.dtype != "fp32" else []
        src = vals if p.dtype != "fp32" else ub_in[0]
        ops += [vop("dup", n, "int32", ids, flops=0),  # CreateVecIndex (+ chunk offset)
                vop("sort32", n, "fp32", pa, src, ids, out_n=2 * n)]
        merge, res = _merge_ops(nr, cdiv(cp, 32), 32, k, cp, pa, pb)
        return ops + merge + [vop("copy", 2 * nr * k, "fp32", ub_out[0], res, flops=0)]

    k1 = streaming_kernel(
        "top_k_chunks", "top_k", hw, units, [Stream(x, chunk * e, 0, 0, pitch if pitch != chunk * e else 0)],
        [Stream(ws, k * pair, 0, 0, out_pitch if out_pitch != k * pair else 0)], chunk_topk,
        tmp_row_bytes=[cp * 4, cp * 4, cp * pair, cp * pair])

    row_pairs = parts * k
    row_pitch = align_up(row_pairs * pair, UB_BLOCK)
    kp = align_up(k * 4, UB_BLOCK) // 4  # a row of k fp32 values, padded to 32 bytes

    def draw(nr, ub_in, ub_out, tmp, consts):
        pa, v, best = tmp
        merge, res = _merge_ops(nr, parts, k, k, parts * k, ub_in[0], pa)
        n = nr * kp
        ops = merge + [vop("gather", n, "fp32", v, res, flops=0)]  # the values out of the pairs
        ops += scalar_read()  # each row's max is its first pair
        ops += _per_row(nr, kp * 4, lambda at: [vop("adds", kp, "fp32", at(v), at(v))])
        ops += [vop("exp", n, "fp32", v, v), vop("div", n, "fp32", v, v, ub_in[1]),
                vop("reduce_max", n, "fp32", best, v, out_n=2 * nr),
                vop("gather", nr, "int32", ub_out[0], res, flops=0)]  # vocab index of the winner
        return ops

    k2 = streaming_kernel(
        "top_k_draw", "top_k", hw, rows,
        [Stream(ws, row_pairs * pair, 0, 0, row_pitch if row_pitch != row_pairs * pair else 0),
         Stream(noise, k * 4, 0, 0, kp * 4 if kp * 4 != k * 4 else 0)],
        [Stream(tok, 4)], draw, tmp_row_bytes=[row_pitch, kp * 4, RECORD_BYTES])
    # one comparison per logit (a selection needs at least that) + the draw over k per row
    return _lowered("top_k", p, [k1, k2], rows * vocab + 4 * rows * k,
                    [TensorInfo("logits", p.shape, p.dtype), TensorInfo("noise", (*lead, k), "fp32")],
                    [TensorInfo("token", tuple(lead) or (1,), "int32")], workspace_bytes=units * k * pair)
