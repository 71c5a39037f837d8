"""CANN op types -> npusim op types and parameters: the one table (OPMAP) calibration
reads profiles through.

Each entry reads a measured row's shapes and dtypes into the parameters of the npusim
op that does the same work. A row that cannot be mapped (an op type not in the table,
a task on the AI CPU, a layout the shapes do not pin down) gets a reason; the caller
counts and lists those rows, it never drops them silently. Modelling assumptions are
stated next to the entry they belong to.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from attrs import frozen

from npusim.calibrate.profile import ProfileRow
from npusim.calibrate.timing import KERNELS, METHODS, STEP

if TYPE_CHECKING:
    from npusim.calibrate.hccl import HcclRow

# msprof's dtype names (FLOAT16, DT_BF16, FLOAT, ...) and npusim's own (FP16) -> npusim's
DTYPES = {"FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16", "BF16": "bf16", "BFLOAT16": "bf16",
          "FLOAT": "fp32", "FLOAT32": "fp32", "FP32": "fp32", "INT8": "int8", "UINT8": "uint8",
          "INT16": "int16", "INT32": "int32", "INT64": "int64"}
# msprof's format names (with or without FORMAT_) -> npusim's layouts (FRACTAL_NZ is the
# cube's 16 x 16 fractal layout)
FORMATS = {"ND": "ND", "NCHW": "ND", "NHWC": "ND", "FRACTAL_NZ": "NZ", "NZ": "NZ"}
# task types run by AI cores; AI_CPU and communication tasks are not simulated here
CORE_TASK_TYPES = ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "MIX_AI_CORE", "")


class Unmappable(Exception):
    """A row the table cannot map; its message is the reason shown in the report."""


@frozen
class Mapped:
    """A measured row as npusim ops: `op` and `params` the (first) op, `more` the ops
    of the further kernels a row sums (OP Type "Mul+Add+Exp"), `timing` how the row
    was timed (npusim.calibrate.timing). `key` is what deduplicates simulations.
    `row`: a ProfileRow, or an hccl_test row (npusim.calibrate.hccl); both give file,
    line, op_name, op_type, duration_us and where."""

    row: ProfileRow | HcclRow
    op: str
    params: tuple[tuple[str, object], ...]
    more: tuple[tuple[str, tuple], ...] = ()
    timing: str = KERNELS
    kernel: int | None = None  # npusim's own profile: the row is this kernel of the op (its index; None: all)

    @property
    def key(self) -> tuple:
        return (self.op, self.params, self.more, self.timing, self.kernel)


def _dtype(names: tuple[str, ...], i: int, row: ProfileRow, what: str = "Input Data Types") -> str:
    if i >= len(names) or not names[i]:
        raise Unmappable(f"no dtype for tensor {i} in '{what}'")
    name = names[i].upper().removeprefix("DT_")
    if name not in DTYPES:
        raise Unmappable(f"dtype {names[i]} not simulated")
    return DTYPES[name]


def _format(name: str) -> str | None:
    return FORMATS.get(name.upper().removeprefix("FORMAT_"))


def _shape(row: ProfileRow, i: int, min_rank: int = 1) -> tuple[int, ...]:
    if i >= len(row.input_shapes) or len(row.input_shapes[i]) < min_rank:
        raise Unmappable(f"input {i} needs at least {min_rank} dimension(s), 'Input Shapes' has "
                         f"{';'.join(','.join(map(str, s)) for s in row.input_shapes) or 'none'}")
    if 0 in row.input_shapes[i]:
        raise Unmappable("an empty tensor (a zero dimension)")
    return row.input_shapes[i]


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """[.., h] as [rows, h]: row-wise and elementwise ops see their leading dims as rows."""
    return math.prod(shape[:-1]), shape[-1]


def _matmul(row: ProfileRow) -> dict:
    a, b = _shape(row, 0, 2), _shape(row, 1, 2)
    if len(a) != 2 or len(b) != 2:
        raise Unmappable("MatMul with inputs of rank other than 2 (use BatchMatMul's entry)")
    return _gemm(row, a, b)


def _gemm(row: ProfileRow, a: tuple[int, ...], b: tuple[int, ...], bias: bool = True) -> dict:
    """m, n, k and trans_b of A [.., m, k] @ B [.., k, n] (or B stored [.., n, k]); the
    output shape [.., m, n] decides between the two when k == n. `bias`: whether input 2
    (a row of n) is a bias."""
    m, k = a[-2:]
    out = row.output_shapes[0] if row.output_shapes else ()
    n_out = out[-1] if out else None
    if b[-2] == k and (n_out is None or b[-1] == n_out):
        n, trans_b = b[-1], False
    elif b[-1] == k and (n_out is None or b[-2] == n_out):
        n, trans_b = b[-2], True
    else:
        raise Unmappable(f"A {a} and B {b} share no reduction dim (transposed A is not modelled)")
    dtype = _dtype(row.input_dtypes, 0, row)
    out_dtype = _dtype(row.output_dtypes, 0, row, "Output Data Types") if row.output_dtypes else dtype
    params = dict(m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype, trans_b=trans_b)
    if len(row.input_formats) > 1 and _format(row.input_formats[1]) == "NZ":
        params["format_b"] = "NZ"
    row_of_n = row.input_shapes[2] if len(row.input_shapes) > 2 else ()
    if bias and row_of_n and row_of_n[-1] == n and math.prod(row_of_n) == n:
        params["bias"] = True
    return params


def _batch_matmul(row: ProfileRow) -> dict:
    a, b = _shape(row, 0, 2), _shape(row, 1, 2)  # 2-D inputs: a batch of one
    params = _gemm(row, a, b)
    if len(b) > 2 and math.prod(b[:-2]) != math.prod(a[:-2]):
        raise Unmappable(f"batch dims of A {a} and B {b} differ (broadcast B is not modelled)")
    return params | dict(batch=math.prod(a[:-2]))


def _attention_shape(row: ProfileRow, i: int) -> tuple[int, int, int, int]:
    """Attention input i as (batch, heads, seq, head_dim). The layout is an op attribute
    msprof does not list: BSND where the row's note names it ("BSND", "[B,S,N,D]"),
    else BNSD is assumed. 3-D (BSH) inputs are refused: their shape does not give the
    head count."""
    shape = _shape(row, i, 3)
    if len(shape) != 4:
        raise Unmappable(f"attention input {i} of shape {shape}: only 4-D BNSD or BSND inputs are mapped "
                         "(a BSH shape does not give the head count)")
    if "BSND" in row.note or "[B,S,N,D]" in row.note:
        b, s, n, d = shape
        return b, n, s, d
    return shape


def _causal(row: ProfileRow, sq: int, skv: int) -> bool:
    """Whether the call had a causal mask: as the note says (a causal sparse mode or
    is_causal=true; "no mask" or is_causal=false), else assumed for a prefill
    self-attention (queries as long as the keys): the mask is an input msprof does not
    describe."""
    note = row.note.lower()
    if "no mask" in note or "is_causal=false" in note:
        return False
    if "causal" in note:
        return True
    return sq == skv


def _attention(row: ProfileRow) -> Parts:
    """Flash attention over [batch, heads, seq, head_dim] q and k/v; one query token per
    sequence is a decode step (npusim's decode_attention)."""
    b, n, sq, d = _attention_shape(row, 0)
    _, nkv, skv, _ = _attention_shape(row, 1)
    dtype = _dtype(row.input_dtypes, 0, row)
    if sq == 1:
        return [("decode_attention", dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, context=skv, dtype=dtype))]
    return [("flash_attention", dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, seq_q=sq, seq_kv=skv,
                                     causal=_causal(row, sq, skv), dtype=dtype))]


def _incre_flash_attention(row: ProfileRow) -> dict:
    b, n, sq, d = _attention_shape(row, 0)
    if sq != 1:
        raise Unmappable(f"incremental attention with {sq} query tokens per sequence (decode has 1)")
    _, nkv, skv, _ = _attention_shape(row, 1)
    return dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, context=skv, dtype=_dtype(row.input_dtypes, 0, row))


def _present(row: ProfileRow, i: int) -> bool:
    """Whether optional input i was passed (an empty entry in Input Shapes: it was not)."""
    return i < len(row.input_shapes) and bool(row.input_shapes[i])


def _quant_matmul(row: ProfileRow) -> Parts:
    """QuantBatchMatmulV3: int8 x1 [.., m, k] @ int8 x2 [.., k, n] -> fp16/bf16, dequantised
    by per-channel scales (a batch of them with a leading dim). # assumption: a per-token
    scale (input 4) and an int32 bias are applied in the kernel's epilogue at no cost
    the cube's does not already pay."""
    a, b = _shape(row, 0, 2), _shape(row, 1, 2)
    params = _gemm(row, a, b, bias=False)
    if len(a) > 2:
        return [("batch_matmul", params | dict(batch=math.prod(a[:-2])))]
    return [("matmul", params)]


def _weight_quant_matmul(row: ProfileRow) -> dict:
    """WeightQuantBatchMatmulV2: x [m, k] (fp16/bf16) @ int8 weight [k, n] with per-channel
    antiquant scales (W8A16). # assumption: an antiquant offset costs nothing beyond the
    scale (x @ (w + o) = x @ w + rowsum(x) * o, applied with the scale per channel)."""
    params = _gemm(row, _shape(row, 0, 2), _shape(row, 1, 2), bias=False)
    return params | dict(weight_dtype="int8", bias=_present(row, 4))


def _group_sizes(row: ProfileRow, m: int, groups: int) -> tuple[int, ...]:
    """Rows of x per group: the per-group outputs' rows when the kernel writes one output
    per group, else the note's cumulative group_list; without either, assumed equal."""
    outs = row.output_shapes
    if len(outs) == groups and sum(o[0] for o in outs if o) == m:
        return tuple(o[0] if o else 0 for o in outs)
    found = re.search(r"group_list[^\[]*\[([\d, ]+)\]", row.note)
    if found:
        ends = [int(v) for v in found[1].split(",")]
        if len(ends) == groups and ends[-1] == m:
            return tuple(e - s for s, e in zip([0, *ends[:-1]], ends))
    if m % groups:
        raise Unmappable(f"GroupedMatmul of {m} rows in {groups} groups: the group sizes are not in the row")
    return (m // groups,) * groups


def _grouped_matmul(row: ProfileRow) -> dict:
    """GroupedMatmul: x [m, k], weights [E, k, n] (or [E, n, k]), optional bias [E, n]."""
    x, w = _shape(row, 0, 2), _shape(row, 1, 3)
    if len(x) != 2 or len(w) != 3:
        raise Unmappable(f"GroupedMatmul of x {x} and weights {w}: expected x [m, k] and weights [E, k, n]")
    m, k = x
    groups = w[0]
    widths = {o[-1] for o in row.output_shapes if o}
    if w[1] == k and (not widths or widths == {w[2]}):
        n, trans_b = w[2], False
    elif w[2] == k:
        n, trans_b = w[1], True
    else:
        raise Unmappable(f"GroupedMatmul of x {x} and weights {w}: no dim of the weights matches k={k}")
    dtype = _dtype(row.input_dtypes, 0, row)
    out_dtype = _dtype(row.output_dtypes, 0, row, "Output Data Types") if row.output_dtypes else dtype
    bias = _dtype(row.input_dtypes, 2, row) if _present(row, 2) else ""
    return dict(group_sizes=_group_sizes(row, m, groups), k=k, n=n, dtype=dtype, out_dtype=out_dtype,
                trans_b=trans_b, bias=bias)


def _rowwise(row: ProfileRow) -> dict:
    """Elementwise and row-wise ops on input 0 as [rows, h]."""
    return dict(shape=_rows_cols(_shape(row, 0)), dtype=_dtype(row.input_dtypes, 0, row))


def _last_dim(row: ProfileRow) -> dict:
    """A reduction over the last dim (ArgMax), refused along another."""
    x = _shape(row, 0)
    dim = _dim(row, x)
    if dim != len(x) - 1:
        raise Unmappable(f"{row.op_type} along dim {dim} of {x} (only the last dim is modelled)")
    return _rowwise(row)


def _norm(weight: int) -> Reader:
    """A norm over the trailing dims its weight (input `weight`) covers: [rows, prod(weight)]."""

    def read(row: ProfileRow) -> dict:
        x = _shape(row, 0)
        gamma = row.input_shapes[weight] if len(row.input_shapes) > weight and row.input_shapes[weight] else x[-1:]
        if len(gamma) > len(x) or x[len(x) - len(gamma):] != tuple(gamma):
            raise Unmappable(f"{row.op_type} of {x} with a weight of shape {gamma} (input {weight}): "
                             "the weight is not x's trailing dims")
        return dict(shape=(math.prod(x) // math.prod(gamma), math.prod(gamma)), dtype=_dtype(row.input_dtypes, 0, row))

    return read


def _binary(op: str) -> Callable[[ProfileRow], Parts]:
    """Add / Mul of two tensors of one shape (npusim's add, mul), or of a tensor and a
    scalar - a scalar input not listed, or of one element - which is one input stream
    and one simple vector op per element: Muls, and Adds priced as Muls (npusim's
    scale). Other broadcasts are not modelled."""

    def read(row: ProfileRow) -> Parts:
        x = _shape(row, 0)
        other = row.input_shapes[1] if len(row.input_shapes) > 1 else ()
        if math.prod(other) == 1:
            return [("scale", _rowwise(row))]
        if other != x:
            raise Unmappable(f"broadcast {x} with {other} (only equal shapes and scalars are modelled)")
        return [(op, _rowwise(row))]

    return read


def _maximum(row: ProfileRow) -> dict:
    return dict(shape=_shape(row, 0), shape2=_shape(row, 1), dtype=_dtype(row.input_dtypes, 0, row))


def _attrs(row: ProfileRow) -> dict[str, float]:
    """The call's numeric attributes as the note lists them: "attrs {base: -1.0, scale: 2.0}"."""
    found = re.search(r"attrs \{([^}]*)\}", row.note)
    if not found:
        return {}
    return {k.strip(): float(v) for k, v in (kv.split(":") for kv in found[1].split(","))}


def _exp(row: ProfileRow) -> dict:
    """Exp: y = base^(scale * x + shift), CANN's attributes (e, 1, 0 unless the note gives them)."""
    keep = {k: v for k, v in _attrs(row).items() if k in ("base", "scale", "shift")}
    return dict(shape=_shape(row, 0), dtype=_dtype(row.input_dtypes, 0, row)) | keep


def _fused_exp(row: ProfileRow) -> dict:
    """AutomaticBufferFusionOp: a kernel the graph engine fused; its ops are in the note
    only. Mapped when the note says it computes exp((scale*x+shift)*ln(base)) - one
    streaming pass, which is npusim's exp with those attributes."""
    if "exp(" not in row.note:
        raise Unmappable("a graph-fused kernel whose ops are not given (only a fused exp is mapped)")
    return _exp(row)


def _transpose(row: ProfileRow) -> dict:
    """Transpose: the permutation is read off the input and output shapes; where dims
    repeat (a square matrix) it is assumed to swap the last two."""
    x = _shape(row, 0)
    y = row.output_shapes[0] if row.output_shapes else ()
    if sorted(y) != sorted(x):
        raise Unmappable(f"Transpose of {x} to {y}: the output is not a permutation of the input")
    if len(set(x)) == len(x):
        perm = tuple(x.index(d) for d in y)
    elif y == x[:-2] + (x[-1], x[-2]):
        perm = tuple(range(len(x) - 2)) + (len(x) - 1, len(x) - 2)
    else:
        raise Unmappable(f"Transpose of {x} to {y}: repeated dims leave the permutation open")
    return dict(shape=x, perm=perm, dtype=_dtype(row.input_dtypes, 0, row))


def _dynamic_quant(row: ProfileRow) -> dict:
    """DynamicQuant: per-token int8 quantisation over the last dim (npusim's quantize_per_token)."""
    rows, hidden = _rows_cols(_shape(row, 0))
    return dict(rows=rows, hidden=hidden, dtype=_dtype(row.input_dtypes, 0, row))


def _copy(row: ProfileRow) -> dict:
    return dict(n=math.prod(_shape(row, 0)), dtype=_dtype(row.input_dtypes, 0, row))


def _dim(row: ProfileRow, x: tuple[int, ...]) -> int:
    """The dim an op works along: the last unless the note's attributes give another
    ("attrs {dim: 0}")."""
    found = re.search(r"dim: *(-?\d+)", row.note)
    if not found:
        return len(x) - 1
    if not -len(x) <= int(found[1]) < len(x):
        raise Unmappable(f"the note's dim {found[1]} is not a dim of input 0 {x}")
    return int(found[1]) % len(x)


def _softmax(row: ProfileRow) -> dict:
    """Softmax along the note's dim (the last unless it gives another)."""
    x = _shape(row, 0)
    return dict(shape=x, dtype=_dtype(row.input_dtypes, 0, row), dim=_dim(row, x) - len(x))


def _split_dim(row: ProfileRow) -> tuple[tuple[int, ...], int]:
    """The input and the dim npu_swiglu splits into gate and up halves (_dim)."""
    x = _shape(row, 0)
    dim = _dim(row, x)
    if x[dim] % 2:
        raise Unmappable(f"SwiGlu of {x} split on dim {dim} of odd length {x[dim]}")
    return x, dim


def _swiglu(row: ProfileRow) -> dict:
    """SwiGlu over its split dim: the halves along dim d of [.., D_d, ...] are each one run
    of D_d/2 x (the dims after d) elements per leading index, which is npusim's swiglu of
    shape [prod(dims before d), D_d x prod(dims after d)] (gate and up: the two halves)."""
    x, dim = _split_dim(row)
    return dict(shape=(math.prod(x[:dim]), math.prod(x[dim:])), dtype=_dtype(row.input_dtypes, 0, row))


def _slice(row: ProfileRow) -> dict:
    """Slice: one copy of the part it keeps (its output). # assumption: in a row that
    sums Slice and SwiGlu (npu_swiglu; no output shape of its own) it copies one half
    of the input."""
    x = _shape(row, 0)
    kept = math.prod(row.output_shapes[0]) if "+" not in row.op_type and row.output_shapes else math.prod(x) // 2
    return dict(n=kept, dtype=_dtype(row.input_dtypes, 0, row))


def _cast(row: ProfileRow) -> dict:
    if not row.output_dtypes:
        raise Unmappable("no 'Output Data Types' column: the target dtype is unknown")
    return _rowwise(row) | dict(out_dtype=_dtype(row.output_dtypes, 0, row, "Output Data Types"))


def _rope(row: ProfileRow) -> dict:
    x = _shape(row, 0, 3)
    return dict(shape=(math.prod(x[:-2]), x[-2], x[-1]), dtype=_dtype(row.input_dtypes, 0, row))


def _trans_data(row: ProfileRow) -> dict:
    src = _format(row.input_formats[0]) if row.input_formats else None
    dst = _format(row.output_formats[0]) if row.output_formats else None
    if src is None or dst is None or src == dst:
        raise Unmappable("TransData needs input and output formats among ND and FRACTAL_NZ ('Output Formats')")
    nd = _shape(row, 0) if src == "ND" else (row.output_shapes[0] if row.output_shapes else ())
    if len(nd) < 2:
        raise Unmappable("TransData: no 2-D ND shape among its tensors")
    return dict(shape=_rows_cols(nd), dtype=_dtype(row.input_dtypes, 0, row), src_format=src, dst_format=dst)


def _top_k(row: ProfileRow) -> dict:
    out = row.output_shapes[0] if row.output_shapes else ()
    if not out:
        raise Unmappable("TopK: no output shape to read k from")
    return _last_dim(row) | dict(k=out[-1])


def _gather(row: ProfileRow) -> dict:
    table, ids = _shape(row, 0, 2), _shape(row, 1)
    if len(table) != 2:
        raise Unmappable(f"Gather from a table of shape {table} (an embedding table is 2-D)")
    return dict(tokens=math.prod(ids), vocab=table[0], hidden=table[1], dtype=_dtype(row.input_dtypes, 0, row))


Parts = list[tuple[str, dict]]  # (npusim op type, params) of each kernel a row sums, in order
# A reader gets a row and returns the params of its table entry's op, or the Parts the
# row stands for (another op, or several kernels).
Reader = Callable[[ProfileRow], "dict | Parts"]

# CANN op type -> (npusim op type, reader). The one mapping table.
OPMAP: dict[str, tuple[str, Reader]] = {
    "MatMul": ("matmul", _matmul),
    "MatMulV2": ("matmul", _matmul),
    "MatMulV3": ("matmul", _matmul),
    "BatchMatMul": ("batch_matmul", _batch_matmul),
    "BatchMatMulV2": ("batch_matmul", _batch_matmul),
    "QuantBatchMatmulV3": ("matmul", _quant_matmul),
    "WeightQuantBatchMatmulV2": ("matmul", _weight_quant_matmul),
    "GroupedMatmul": ("grouped_matmul", _grouped_matmul),
    "FlashAttentionScore": ("flash_attention", _attention),
    "PromptFlashAttention": ("flash_attention", _attention),
    "FusedInferAttentionScore": ("flash_attention", _attention),
    "FlashAttention": ("flash_attention", _attention),
    "IncreFlashAttention": ("decode_attention", _incre_flash_attention),
    "RmsNorm": ("rms_norm", _norm(1)),
    "AddRmsNorm": ("add_rms_norm", _norm(2)),
    "LayerNorm": ("layer_norm", _norm(1)),
    "LayerNormV3": ("layer_norm", _norm(1)),
    "LayerNormV4": ("layer_norm", _norm(1)),
    "Swiglu": ("swiglu", _swiglu),
    "SwiGlu": ("swiglu", _swiglu),
    "RotaryMul": ("rope", _rope),
    "RoPE": ("rope", _rope),
    "RotaryPositionEmbedding": ("rope", _rope),
    "ApplyRotaryPosEmb": ("rope", _rope),
    "TransData": ("trans_data", _trans_data),
    "Transpose": ("transpose", _transpose),
    "Cast": ("cast", _cast),
    "Add": ("add", _binary("add")),
    "AddV2": ("add", _binary("add")),
    "Mul": ("mul", _binary("mul")),
    "Muls": ("scale", _rowwise),
    "Maximum": ("maximum", _maximum),
    "Relu": ("relu", _rowwise),
    "Gelu": ("gelu", _rowwise),
    "Swish": ("silu", _rowwise),
    "Silu": ("silu", _rowwise),
    "Sigmoid": ("sigmoid", _rowwise),
    "Exp": ("exp", _exp),
    "AutomaticBufferFusionOp": ("exp", _fused_exp),
    "SoftmaxV2": ("softmax", _softmax),
    "Softmax": ("softmax", _softmax),
    "DynamicQuant": ("quantize_per_token", _dynamic_quant),
    "ArgMaxV2": ("argmax", _last_dim),
    "ArgMax": ("argmax", _last_dim),
    "TopK": ("top_k", _top_k),
    "TopKV2": ("top_k", _top_k),
    "GatherV2": ("embedding", _gather),
    "copy_": ("copy", _copy),
    "Slice": ("copy", _slice),
}

# npusim's own op_summary (npusim run / op --profile) names each op by its npusim type:
# read by the first entry of the table that maps to it (the plain CANN op it stands for)
for _op, _read in reversed(list(OPMAP.values())):
    OPMAP[_op] = (_op, _read)


def _kernel_list(row: ProfileRow, names: list[str]) -> list[str]:
    """The kernels a "+" row sums, in order: each name of its OP Type as many times as
    the note's kernel list counts it ("kernels: Mul×2 + Add×1 + Exp×1"), once without."""
    counts = dict(re.findall(r"(\w+)×(\d+)", row.note.split("kernels:")[-1])) if "kernels:" in row.note else {}
    return [name for name in names for _ in range(int(counts.get(name, 1)))]


def _parts(row: ProfileRow) -> Parts:
    names = row.op_type.split("+")
    if any(name not in OPMAP for name in names):
        missing = next(name for name in names if name not in OPMAP)
        raise Unmappable("op type not in the mapping table" if len(names) == 1 else
                         f"kernel {missing} of {row.op_type} not in the mapping table")
    parts: Parts = []
    for name in _kernel_list(row, names) if len(names) > 1 else names:
        op, read = OPMAP[name]
        got = read(attrs.evolve(row, op_type=name))
        parts += got if isinstance(got, list) else [(op, got)]
    return parts


def map_row(row: ProfileRow) -> Mapped:
    """The npusim ops of a measured row, or Unmappable with the reason. A row whose OP
    Type joins several kernels with "+" (their times summed) maps each of them."""
    if row.task_type.upper() not in CORE_TASK_TYPES:
        raise Unmappable(f"task type {row.task_type} (only AI core tasks are simulated)")
    if row.method not in METHODS:
        raise Unmappable(f"timing method '{row.method}' (known: {', '.join(m for m in METHODS if m)})")
    if row.npusim_op:  # npusim's own profile: the op and parameters it names, this row's kernel of it
        if not row.npusim_kernel.isdigit():
            raise Unmappable(f"column 'npusim Kernel': expected the kernel's index (0, 1, ...), got "
                             f"'{row.npusim_kernel}'")
        if row.step:  # a decoder step's: that kernel as it ran in the step, with what ran beside it
            return Mapped(row, STEP, (("node", row.npusim_node), ("step", row.step)), (), KERNELS,
                          int(row.npusim_kernel))
        return Mapped(row, row.npusim_op, _sorted(_own_params(row)), (), METHODS[row.method], int(row.npusim_kernel))
    (op, params), *more = _parts(row)
    return Mapped(row, op, _sorted(params), tuple((o, _sorted(p)) for o, p in more), METHODS[row.method])


def _sorted(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _tuples(v):
    """JSON's lists as the tuples npusim's parameters hold (shapes, part widths)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _own_params(row: ProfileRow) -> dict:
    try:
        params = json.loads(row.npusim_params or "{}")
    except json.JSONDecodeError as e:
        raise Unmappable(f"column 'npusim Params' is not JSON ({e.msg})") from None
    if not isinstance(params, dict):
        raise Unmappable("column 'npusim Params' is not a JSON object of parameters")
    return {k: _tuples(v) for k, v in params.items()}
