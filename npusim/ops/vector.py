"""Vector (AIV) operators: the elementwise ones, and the conventions every vector op
follows (the row-wise ones in npusim.ops.rowwise, sampling in npusim.ops.sampling,
gated activations and soft-capping in their own modules).

Every vector op is one `streaming_kernel` (argmax and top-k sampling: two, a split
reduction): a core streams its rows through UB double-buffered, and V runs the
op's instruction sequence on each tile. The sequences are what an Ascend C
author writes, and they are what the op costs:

- fp16, fp32 and int32 arithmetic runs in the input dtype. bf16 and int8 have no
  vector arithmetic on this chip (only casts), so their ops cast in to a WIDENED
  dtype (bf16 -> fp32, int8 -> fp16, both exact) and back. int64 has no 64-bit ALU
  at all: an op on it works on the element's two int32 words (npusim.ops.maximum:
  compare and select).
  # assumption: 910B vector ALU ops take fp16/fp32/int16/int32, not bf16, int8 or int64
- activations built on exp (sigmoid, silu, gelu, swiglu, geglu) compute in fp32 for
  fp16 input too, as CANN's 910B kernels do in their default high-precision mode
  (the Sigmoid and Gelu TBE kernels, the SwiGlu Ascend C kernel); exp alone runs in
  fp16 (its default is high performance) and maximum in its dtype.
- norms and softmax compute in fp32 whatever the input (cast in, cast out), as
  CANN's kernels do for accuracy. Short rows are packed (npusim.ops.row_stats): a tile's rows are reduced by one instruction into one
  32-byte statistic block a row, and the statistics are applied by instructions
  repeating over the rows - RMSNorm up to npusim.ops.rowwise.MERGE_MAX_COLS and
  DynamicQuant's aligned rows. An RMSNorm of long rows works one row at a time, its
  statistic read back by the scalar unit (V -> S -> V); LayerNorm applies its
  statistics one instruction a row, read back once a tile; softmax works one row at a
  time with a scalar read-back per statistic (910B's SoftmaxV2 is a TBE kernel whose
  schedule is not public; Ascend C's SoftMax, which packs rows, puts the measured long
  rows up to 63% fast, so it is not taken as its model).
- rows are kept whole in UB (the hidden size of a norm, the width of a softmax)
  when one fits (double-buffered, else single-buffered). A row that does not fit
  even once is cut into column chunks: gated activations stream (row, chunk)
  units (npusim.ops.column_tiles; SwiGLU instead tiles rows and columns as CANN's
  SwiGlu host tiling does, npusim.ops.swiglu_tiles); norms and softmax make one pass over the
  chunks per statistic, then one applying it (npusim.ops.wide_rows). Rows whose
  bytes are not a multiple of 32 are padded to 32 bytes in UB (DataCopyPad: a
  tile then moves one DMA segment per row).
- analytic FLOPs count the arithmetic vector ops per element a minimal
  implementation needs (casts and copies are not counted); the roofline prices
  them all at the vector add rate, so ops heavy in exp/div sit further above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, GmTensor, Loop, Pipe, SetFlag, VecOp, WaitFlag, addr
from npusim.ops.build import align_up, line_quantum
from npusim.ops.reference import eltwise, gated, gelu, silu
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Const, Stream, streaming_kernel

FLOAT_DTYPES = ("fp16", "bf16", "fp32")
CAST_DTYPES = ("fp16", "bf16", "fp32", "int8", "int32")
MAX_DTYPES = ("fp16", "bf16", "fp32", "int8", "int32", "int64")
UB_BLOCK = 32  # bytes: UB addresses of vector operands are 32-byte aligned
# the dtype an op on each of these computes in (see the module docstring)
WIDENED = {"bf16": "fp32", "int8": "fp16"}


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


def dtype_validator(choices=FLOAT_DTYPES):
    return one_of(choices)


def vector_lowered(op: str, p, kernels, flops: float, ins: list[TensorInfo], outs: list[TensorInfo],
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


def per_row(nr: int, pitch: int, ops: Callable[[Callable[[int], object]], list]) -> list:
    """One instruction (or a few) per row of the tile: ops(at) gets at(base) = base + r * pitch."""
    return [Loop("r", nr, ops(lambda base: addr(base, r=pitch)))]


def vop(op: str, n: int, dtype: str, dst, *srcs, out_dtype: str | None = None, out_n: int | None = None,
        flops: int = 1, scalar: float | None = None, scalar_src=None, pitches: tuple = ()) -> VecOp:
    """A vector instruction; `scalar` / `scalar_src`: the scalar operand of Muls, Adds and
    Duplicate (an immediate, or the UB address of the fp32 value the scalar unit read);
    `pitches`: a strided instruction's operand layout (VecOp.pitches)."""
    return VecOp(op, n, dtype, dst, tuple(srcs), out_dtype, out_n, flops, scalar, scalar_src, tuple(pitches))


def cast(n: int, src_dtype: str, dst_dtype: str, dst, src) -> VecOp:
    return VecOp("cast", n, src_dtype, dst, (src,), dst_dtype, None, 0)


# ================================================================ elementwise


@frozen
class EltwiseParams:
    shape: tuple = param((8, 4096), "tensor shape (every input and the output)", validator=shape_validator())
    dtype: str = param("fp16", "element dtype", validator=dtype_validator())


@frozen
class ScaleParams(EltwiseParams):
    scale: float = param(0.5, "the scalar s")


def _exp_base(instance, attribute, value) -> None:
    if value != -1.0 and not value > 0:
        raise ValueError(f"'{attribute.name}' must be > 0, or -1 for e, got {value!r}")


@frozen
class ExpParams(EltwiseParams):
    base: float = param(-1.0, "y = base^(scale*x + shift); -1 means e (CANN Exp's attributes)", validator=_exp_base)
    scale: float = param(1.0, "multiplies x")
    shift: float = param(0.0, "added to scale*x")

    @property
    def ln_base(self) -> float:
        return 1.0 if self.base == -1.0 else math.log(self.base)


@frozen
class CastParams:
    shape: tuple = param((8, 4096), "tensor shape", validator=shape_validator())
    dtype: str = param("fp16", "input dtype", validator=dtype_validator(CAST_DTYPES))
    out_dtype: str = param("fp32", "output dtype", validator=dtype_validator(CAST_DTYPES))


@frozen
class SwigluParams:
    shape: tuple = param((8, 16896), "input shape [.., 2h]: gate in [.., :h], up in [.., h:]",
                         validator=shape_validator())
    dtype: str = param("fp16", "element dtype", validator=dtype_validator())


# body(n, UB srcs, UB dst, UB temps, compute dtype) -> vector instructions
Body = Callable[[int, Sequence[int], int, Sequence[int], str], list]


def compute_dtype(dtype: str, precise: bool = False) -> str | None:
    """The dtype an op on `dtype` computes in when it is not `dtype` (None: its own):
    WIDENED, and fp32 for 16-bit floats when the op is `precise` (see the module doc)."""
    if precise and dtype in ("fp16", "bf16"):
        return "fp32"
    return WIDENED.get(dtype)


def eltwise_kernel(op: str, hw: HwConfig, dtype: str, rows: int, ins: list[Stream], out: Stream,
                    row_elems: int, body: Body, n_tmp: int, quantum_: int,
                    consts: Sequence[tuple[GmTensor, int]] = (), precise: bool = False):
    """A streaming kernel applying `body` to whole tiles. row_elems: elements of a row
    as laid out in UB (1 for a plain elementwise op, the padded half row for SwiGLU).
    A WIDENED dtype casts every input to a scratch in its compute dtype, runs `body`
    there and casts back. consts: (GM vector, elements) every core loads into UB once
    (a broadcast operand), handed to `body` after the tile's inputs, in the compute
    dtype (a WIDENED one cast once per core, in place). precise: see compute_dtype."""
    wide = compute_dtype(dtype, precise)
    e, ec = DTYPE_BYTES[dtype], DTYPE_BYTES[wide or dtype]
    loads = [_const(t, elems, e, ec) for t, elems in consts]
    if wide:
        parts = [row_elems * ec] * (len(ins) + 1 + n_tmp)

        def compute(nr, ub_in, ub_out, tmp, const_ub):
            n = nr * row_elems
            ops = [cast(n, dtype, wide, tmp[i], ub) for i, ub in enumerate(ub_in)]
            ops += body(n, [*tmp[:len(ins)], *const_ub], tmp[len(ins)], tmp[len(ins) + 1:], wide)
            return ops + [cast(n, wide, dtype, ub_out[0], tmp[len(ins)])]

        def setup(const_ub):
            return [cast(elems, dtype, wide, ub, ub + c.ub_offset)
                    for (_, elems), c, ub in zip(consts, loads, const_ub)]
    else:
        parts = [row_elems * e] * n_tmp
        setup = None

        def compute(nr, ub_in, ub_out, tmp, const_ub):
            return body(nr * row_elems, [*ub_in, *const_ub], ub_out[0], tmp, dtype)

    return streaming_kernel(op, op, hw, rows, ins, [out], compute, consts=loads, tmp_row_bytes=parts,
                            quantum=quantum_, setup=setup)


def _const(t: GmTensor, elems: int, e: int, ec: int) -> Const:
    """A vector of `elems` elements of e bytes held in UB as ec-byte elements: a narrower
    one lands in the upper part of its room and is widened there in place (ec = 2e, so
    increasing addresses never overtake the unread part)."""
    pitch = align_up(elems * e, UB_BLOCK)
    room = pitch // e * ec
    return Const(t, elems * e, room, room - pitch)


def lower_eltwise(op: str, p, hw: HwConfig, gm: GmArena, in_names: Sequence[str], body: Body, flops_per_elem: int,
             n_tmp: int = 0, in_shapes: Sequence[tuple] = (), precise: bool = False) -> Lowered:
    """in_shapes: each input's shape as listed (default p.shape; another shape of the same
    size, e.g. a maximum's x2 given as [1, n], streams the same). precise: see compute_dtype."""
    n, e = numel(p.shape), DTYPE_BYTES[p.dtype]
    tensors = [gm.tensor(name, n * e) for name in in_names]
    y = gm.tensor("y", n * e)
    q = quantum(hw, n, e, fallback=max(1, hw.dma.burst_bytes // e))
    k = eltwise_kernel(op, hw, p.dtype, n, [Stream(t, e) for t in tensors], Stream(y, e), 1, body, n_tmp, q,
                        precise=precise)
    shapes = in_shapes or [p.shape] * len(in_names)
    return vector_lowered(op, p, [k], flops_per_elem * n,
                          [TensorInfo(name, shape, p.dtype) for name, shape in zip(in_names, shapes)],
                          [TensorInfo("y", p.shape, p.dtype)])


@register("add", EltwiseParams, reference=eltwise(lambda p, a, b: a + b, "x1", "x2"), in_place=True,
          ins=("x1", "x2"), outs=("y",))
def lower_add(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Elementwise add: y = x1 + x2."""
    return lower_eltwise("add", p, hw, gm, ("x1", "x2"), lambda n, s, d, t, dt: [vop("add", n, dt, d, s[0], s[1])], 1)


@register("mul", EltwiseParams, reference=eltwise(lambda p, a, b: a * b, "x1", "x2"), in_place=True,
          ins=("x1", "x2"), outs=("y",))
def lower_mul(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Elementwise multiply: y = x1 * x2."""
    return lower_eltwise("mul", p, hw, gm, ("x1", "x2"), lambda n, s, d, t, dt: [vop("mul", n, dt, d, s[0], s[1])], 1)


@register("relu", EltwiseParams, reference=eltwise(lambda p, a: np.maximum(a, 0), "x"), in_place=True,
          ins=("x",), outs=("y",))
def lower_relu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """ReLU: y = max(x, 0)."""
    return lower_eltwise("relu", p, hw, gm, ("x",), lambda n, s, d, t, dt: [vop("relu", n, dt, d, s[0])], 1)


@register("scale", ScaleParams, reference=eltwise(lambda p, a: a * np.float32(p.scale), "x"), in_place=True,
          ins=("x",), outs=("y",))
def lower_scale(p: ScaleParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Multiply by a scalar: y = x * s (Muls)."""
    return lower_eltwise("scale", p, hw, gm, ("x",),
                         lambda n, s, d, t, dt: [vop("muls", n, dt, d, s[0], scalar=p.scale)], 1)


@register("scale_add", ScaleParams, reference=eltwise(lambda p, a, r: a * np.float32(p.scale) + r, "x", "r"),
          in_place=True, ins=("x", "r"), outs=("y",))
def lower_scale_add(p: ScaleParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Scale and add: y = x * s + r (Muls then Add)."""
    return lower_eltwise("scale_add", p, hw, gm, ("x", "r"),
                    lambda n, s, d, t, dt: [vop("muls", n, dt, d, s[0], scalar=p.scale),
                                            vop("add", n, dt, d, d, s[1])], 2)


SILU_FLOPS = 4  # per element: silu_ops' instructions
SIGMOID_FLOPS = 4  # per element: sigmoid_ops' arithmetic (the Duplicate of ones is not counted)


def one_plus_exp_neg(n: int, x, t, dt: str) -> list:
    """t = 1 + exp(-x): Muls(-1), Exp, Adds(1) - the denominator of sigmoid and silu."""
    return [vop("muls", n, dt, t, x, scalar=-1.0), vop("exp", n, dt, t, t), vop("adds", n, dt, t, t, scalar=1.0)]


def silu_ops(n: int, x, dst, t, dt: str) -> list:
    """silu(x) = x / (1 + exp(-x)): Muls(-1), Exp, Adds(1), Div - 4 ops per element."""
    return one_plus_exp_neg(n, x, t, dt) + [vop("div", n, dt, dst, x, t)]


def sigmoid_ops(n: int, x, dst, t, dt: str) -> list:
    """sigmoid(x) = 1 / (1 + exp(-x)) as Ascend C's Sigmoid computes it (CANN 8.1
    sigmoid_impl.h): Muls(-1), Exp, Adds(1), then Duplicate a tensor of ones and Div it
    by the sum (the ones in dst: dst must not be x)."""
    return one_plus_exp_neg(n, x, t, dt) + [vop("dup", n, dt, dst, flops=0, scalar=1.0),
                                            vop("div", n, dt, dst, dst, t)]


def sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-v))


@register("silu", EltwiseParams, reference=eltwise(lambda p, a: silu(a), "x"), in_place=True, ins=("x",),
          outs=("y",))
def lower_silu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """SiLU: y = x * sigmoid(x), as x / (1 + exp(-x))."""
    return lower_eltwise("silu", p, hw, gm, ("x",), lambda n, s, d, t, dt: silu_ops(n, s[0], d, t[0], dt), SILU_FLOPS,
                         n_tmp=1, precise=True)


@register("sigmoid", EltwiseParams, reference=eltwise(lambda p, a: sigmoid(a), "x"), in_place=True, ins=("x",),
          outs=("y",))
def lower_sigmoid(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Sigmoid: y = 1 / (1 + exp(-x))."""
    return lower_eltwise("sigmoid", p, hw, gm, ("x",), lambda n, s, d, t, dt: sigmoid_ops(n, s[0], d, t[0], dt),
                         SIGMOID_FLOPS, n_tmp=1, precise=True)


def exp_steps(p: ExpParams) -> list[str]:
    """The instructions of y = exp((scale*x + shift) * ln(base)) with the constants
    folded: Muls by scale*ln(base) unless it is 1, Adds shift*ln(base) unless it is 0,
    then Exp."""
    k, b = p.scale * p.ln_base, p.shift * p.ln_base
    return ["muls"] * (k != 1) + ["adds"] * (b != 0) + ["exp"]


def reference_exp(p: ExpParams, a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp((np.float32(p.scale) * a + np.float32(p.shift)) * np.float32(p.ln_base))


@register("exp", ExpParams, reference=eltwise(reference_exp, "x"), in_place=True, ins=("x",), outs=("y",))
def lower_exp(p: ExpParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Exp: y = base^(scale*x + shift) (also what a graph-fused AutomaticBufferFusionOp
    computing exp((scale*x + shift) * ln(base)) is: one streaming pass)."""
    steps = exp_steps(p)
    scalars = {"muls": p.scale * p.ln_base, "adds": p.shift * p.ln_base, "exp": None}

    def body(n, s, d, t, dt):
        return [vop(op, n, dt, d, s[0] if i == 0 else d, scalar=scalars[op]) for i, op in enumerate(steps)]

    return lower_eltwise("exp", p, hw, gm, ("x",), body, len(steps))


@register("gelu", EltwiseParams, reference=eltwise(lambda p, a: gelu(a), "x"), in_place=True, ins=("x",),
          outs=("y",))
def lower_gelu(p: EltwiseParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """GELU (tanh form): y = x / (1 + exp(-2c(x + 0.044715 x^3))), c = sqrt(2/pi)."""

    return lower_eltwise("gelu", p, hw, gm, ("x",), lambda n, s, d, t, dt: gelu_ops(n, s[0], d, t[0], dt), GELU_FLOPS,
                         n_tmp=1, precise=True)


GELU_FLOPS = 7  # per element: gelu_ops' instructions
GELU_CUBIC = 0.044715  # the cubic coefficient of GELU's tanh form


def gelu_ops(n: int, x, dst, t, dt: str) -> list:
    """gelu(x) (tanh form) into dst with scratch t (t may be dst; dst may be x): 0.5 (1 + tanh z)
    = 1 / (1 + exp(-2z)); the polynomial in Horner form: t = x*x; t = t * (-2c*0.044715) + (-2c);
    t = t * x; exp; +1; x / t  -> 7 ops."""
    c2 = -2.0 * math.sqrt(2.0 / math.pi)
    return [vop("mul", n, dt, t, x, x), vop("muls", n, dt, t, t, scalar=c2 * GELU_CUBIC),
            vop("adds", n, dt, t, t, scalar=c2),
            vop("mul", n, dt, t, t, x), vop("exp", n, dt, t, t), vop("adds", n, dt, t, t, scalar=1.0),
            vop("div", n, dt, dst, x, t)]


@register("swiglu", SwigluParams, reference=gated(silu), ins=("x",), outs=("y",))
def lower_swiglu(p: SwigluParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """SwiGLU: y = silu(gate) * up, gate and up the two halves of one [.., 2h] input,
    tiled as CANN's SwiGlu kernel tiles it (npusim.ops.swiglu_tiles); a shape its host
    tiling finds no base tile for streams as lower_gated does."""
    from npusim.ops.swiglu_tiles import swiglu_kernel, swiglu_tiling  # here: it imports this module's helpers

    *lead, two_h = p.shape
    if two_h % 2:
        raise ProgramError(f"op swiglu: shape[-1]={two_h} must be even (gate and up halves)")
    h, e = two_h // 2, DTYPE_BYTES[p.dtype]
    rows = numel(lead) if lead else 1
    t = swiglu_tiling(hw, rows, h, p.dtype)
    if t is None:
        return lower_gated("swiglu", p, hw, gm, silu_ops, SILU_FLOPS)
    x = gm.tensor("x", rows * two_h * e)
    y = gm.tensor("y", rows * h * e)
    k = swiglu_kernel("swiglu", hw, t, rows, h, p.dtype, x, y)
    return vector_lowered("swiglu", p, [k], (SILU_FLOPS + 1) * rows * h, [TensorInfo("x", p.shape, p.dtype)],
                          [TensorInfo("y", (*lead, h), p.dtype)])


def lower_gated(op: str, p: SwigluParams, hw: HwConfig, gm: GmArena, act_ops: Callable, act_flops: int) -> Lowered:
    """A gated activation y = act(gate) * up over one [.., 2h] input; act_ops(n, x, dst,
    scratch, dtype) -> its instructions (scratch may be dst, dst may be x)."""
    # One [.., 2h] input, as the fused gate_up projection writes it (torch_npu
    # npu_swiglu takes the same): a tile reads the gate halves and the up halves of
    # its rows as two strided streams (one DMA segment per row each).
    *lead, two_h = p.shape
    if two_h % 2:
        raise ProgramError(f"op {op}: shape[-1]={two_h} must be even (gate and up halves)")
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
    if compute_dtype(p.dtype, precise=True):  # two fp32 scratch rows, not three: act(gate) in place, then up
        hp = pitch // e
        tmp_elem = [4, 4]

        def work(n, ub_in, ub_out, tmp):
            a, b = tmp
            return ([cast(n, p.dtype, "fp32", a, ub_in[0])] + act_ops(n, a, a, b, "fp32")
                    + [cast(n, p.dtype, "fp32", b, ub_in[1]), vop("mul", n, "fp32", a, a, b),
                       cast(n, "fp32", p.dtype, ub_out[0], a)])

        def compute(nr, ub_in, ub_out, tmp, consts):
            return work(nr * hp, ub_in, ub_out, tmp)

        def row_kernel():
            return streaming_kernel(op, op, hw, rows, [gate, up], [out], compute, tmp_row_bytes=[hp * 4, hp * 4],
                                    quantum=q)
    else:
        tmp_elem = [e]

        def body(n, s, d, t, dt):
            return act_ops(n, s[0], t[0], t[0], dt) + [vop("mul", n, dt, d, t[0], s[1])]

        def work(n, ub_in, ub_out, tmp):
            return body(n, ub_in, ub_out[0], tmp, p.dtype)

        def row_kernel():
            return eltwise_kernel(op, hw, p.dtype, rows, [gate, up], out, pitch // e, body, 1, q)
    try:
        k = row_kernel()
    except ProgramError:
        # A row too long for UB: the op is elementwise along the row, so tile its columns.
        from npusim.ops.column_tiles import column_kernel  # here: column_tiles imports this module's helpers

        k = column_kernel(op, hw, rows, h, e, [Stream(x, h * e, 0, two_h * e), Stream(x, h * e, h * e, two_h * e)],
                          [Stream(y, h * e)], work, tmp_elem)
    return vector_lowered(op, p, [k], (act_flops + 1) * rows * h, [TensorInfo("x", p.shape, p.dtype)],
                    [TensorInfo("y", (*lead, h), p.dtype)])


def _cast_values(p: CastParams, a: np.ndarray) -> np.ndarray:
    """x's values as y holds them: an integer out_dtype keeps a float's integer part.
    # assumption: a float converts to an integer rounding toward zero (numpy's astype, the
    #   interpreter's cast), as CANN's Cast does by default (CAST_TRUNC)"""
    return np.trunc(a) if p.out_dtype.startswith("int") else a


@register("cast", CastParams, reference=eltwise(_cast_values, "x"), in_place=True, ins=("x",), outs=("y",))
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
    return vector_lowered("cast", p, [k], n, [TensorInfo("x", p.shape, p.dtype)], [TensorInfo("y", p.shape, p.out_dtype)])
