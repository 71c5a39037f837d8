"""CANN op types -> npusim op types and parameters: the one table (OPMAP) calibration
reads profiles through.

Each entry reads a measured row's shapes and dtypes into the parameters of the npusim
op that does the same work. A row that cannot be mapped (an op type not in the table,
a task on the AI CPU, a layout the shapes do not pin down) gets a reason; the caller
counts and lists those rows, it never drops them silently. Modelling assumptions are
stated next to the entry they belong to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from attrs import frozen

from npusim.calibrate.profile import ProfileRow

if TYPE_CHECKING:
    from npusim.calibrate.hccl import HcclRow

# msprof's dtype names (FLOAT16, DT_BF16, FLOAT, ...) and npusim's own (FP16) -> npusim's
DTYPES = {"FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16", "BF16": "bf16", "BFLOAT16": "bf16",
          "FLOAT": "fp32", "FLOAT32": "fp32", "FP32": "fp32", "INT8": "int8", "UINT8": "uint8",
          "INT16": "int16", "INT32": "int32"}
# msprof's format names (with or without FORMAT_) -> npusim's layouts (FRACTAL_NZ is the
# cube's 16 x 16 fractal layout)
FORMATS = {"ND": "ND", "NCHW": "ND", "NHWC": "ND", "FRACTAL_NZ": "NZ", "NZ": "NZ"}
# task types run by AI cores; AI_CPU and communication tasks are not simulated here
CORE_TASK_TYPES = ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "MIX_AI_CORE", "")


class Unmappable(Exception):
    """A row the table cannot map; its message is the reason shown in the report."""


@frozen
class Mapped:
    """A measured row as an npusim op: `key` is (op type, sorted params) for
    deduplication. `row`: a ProfileRow, or an hccl_test row (npusim.calibrate.hccl);
    both give file, line, op_name, op_type, duration_us and where."""

    row: ProfileRow | HcclRow
    op: str
    params: tuple[tuple[str, object], ...]

    @property
    def key(self) -> tuple:
        return (self.op, self.params)


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


def _gemm(row: ProfileRow, a: tuple[int, ...], b: tuple[int, ...]) -> dict:
    """m, n, k and trans_b of A [.., m, k] @ B [.., k, n] (or B stored [.., n, k]); the
    output shape [.., m, n] decides between the two when k == n."""
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
    bias = row.input_shapes[2] if len(row.input_shapes) > 2 else ()
    if bias and bias[-1] == n and math.prod(bias) == n:
        params["bias"] = True
    return params


def _batch_matmul(row: ProfileRow) -> dict:
    a, b = _shape(row, 0, 2), _shape(row, 1, 2)  # 2-D inputs: a batch of one
    params = _gemm(row, a, b)
    if len(b) > 2 and math.prod(b[:-2]) != math.prod(a[:-2]):
        raise Unmappable(f"batch dims of A {a} and B {b} differ (broadcast B is not modelled)")
    return params | dict(batch=math.prod(a[:-2]))


def _bnsd(row: ProfileRow, i: int) -> tuple[int, int, int, int]:
    """Attention inputs read as BNSD [batch, heads, seq, head_dim]. The layout is an op
    attribute msprof does not list; BNSD is assumed, and 3-D (BSH) inputs are refused
    because the head count is not in their shape."""
    shape = _shape(row, i, 3)
    if len(shape) != 4:
        raise Unmappable(f"attention input {i} of shape {shape}: only 4-D BNSD inputs are mapped "
                         "(a BSH shape does not give the head count)")
    return shape


def _flash_attention(row: ProfileRow) -> dict:
    b, n, sq, d = _bnsd(row, 0)
    _, nkv, skv, _ = _bnsd(row, 1)
    # assumed: a prefill self-attention (as long as its keys) is causal; the mask is an
    # input msprof does not describe
    return dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, seq_q=sq, seq_kv=skv, causal=sq == skv,
                dtype=_dtype(row.input_dtypes, 0, row))


def _incre_flash_attention(row: ProfileRow) -> dict:
    b, n, sq, d = _bnsd(row, 0)
    if sq != 1:
        raise Unmappable(f"incremental attention with {sq} query tokens per sequence (decode has 1)")
    _, nkv, skv, _ = _bnsd(row, 1)
    return dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, context=skv, dtype=_dtype(row.input_dtypes, 0, row))


def _rowwise(row: ProfileRow) -> dict:
    """Elementwise and row-wise ops on input 0 as [rows, h]; a second input (Add, Mul)
    must have the same shape (broadcasting is not modelled)."""
    x = _shape(row, 0)
    if len(row.input_shapes) > 1 and row.input_shapes[1] and row.input_shapes[1] != x and row.op_type in ("Add", "Mul", "AddV2"):
        raise Unmappable(f"broadcast {x} with {row.input_shapes[1]} (only equal shapes are modelled)")
    return dict(shape=_rows_cols(x), dtype=_dtype(row.input_dtypes, 0, row))


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
    return _rowwise(row) | dict(k=out[-1])


def _gather(row: ProfileRow) -> dict:
    table, ids = _shape(row, 0, 2), _shape(row, 1)
    if len(table) != 2:
        raise Unmappable(f"Gather from a table of shape {table} (an embedding table is 2-D)")
    return dict(tokens=math.prod(ids), vocab=table[0], hidden=table[1], dtype=_dtype(row.input_dtypes, 0, row))


# CANN op type -> (npusim op type, row -> params). The one mapping table.
OPMAP: dict[str, tuple[str, Callable[[ProfileRow], dict]]] = {
    "MatMul": ("matmul", _matmul),
    "MatMulV2": ("matmul", _matmul),
    "MatMulV3": ("matmul", _matmul),
    "BatchMatMul": ("batch_matmul", _batch_matmul),
    "BatchMatMulV2": ("batch_matmul", _batch_matmul),
    "FlashAttentionScore": ("flash_attention", _flash_attention),
    "PromptFlashAttention": ("flash_attention", _flash_attention),
    "IncreFlashAttention": ("decode_attention", _incre_flash_attention),
    "RmsNorm": ("rms_norm", _rowwise),
    "AddRmsNorm": ("add_rms_norm", _rowwise),
    "LayerNorm": ("layer_norm", _rowwise),
    "LayerNormV3": ("layer_norm", _rowwise),
    "LayerNormV4": ("layer_norm", _rowwise),
    "Swiglu": ("swiglu", _rowwise),
    "SwiGlu": ("swiglu", _rowwise),
    "RotaryMul": ("rope", _rope),
    "RoPE": ("rope", _rope),
    "RotaryPositionEmbedding": ("rope", _rope),
    "ApplyRotaryPosEmb": ("rope", _rope),
    "TransData": ("trans_data", _trans_data),
    "Cast": ("cast", _cast),
    "Add": ("add", _rowwise),
    "AddV2": ("add", _rowwise),
    "Mul": ("mul", _rowwise),
    "Relu": ("relu", _rowwise),
    "Gelu": ("gelu", _rowwise),
    "Swish": ("silu", _rowwise),
    "Silu": ("silu", _rowwise),
    "SoftmaxV2": ("softmax", _rowwise),
    "Softmax": ("softmax", _rowwise),
    "ArgMaxV2": ("argmax", _rowwise),
    "ArgMax": ("argmax", _rowwise),
    "TopK": ("top_k", _top_k),
    "TopKV2": ("top_k", _top_k),
    "GatherV2": ("embedding", _gather),
}

# npusim's own op_summary (npusim run / op --profile) names each op by its npusim type:
# read by the same entry as the CANN types it stands for
OPMAP |= {op: (op, read) for op, read in dict(OPMAP.values()).items()}


def map_row(row: ProfileRow) -> Mapped:
    """The npusim op of a measured row, or Unmappable with the reason."""
    if row.task_type.upper() not in CORE_TASK_TYPES:
        raise Unmappable(f"task type {row.task_type} (only AI core tasks are simulated)")
    if row.op_type not in OPMAP:
        raise Unmappable("op type not in the mapping table")
    op, read = OPMAP[row.op_type]
    return Mapped(row, op, tuple(sorted(read(row).items())))
