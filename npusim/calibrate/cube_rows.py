"""Readers of the cube's rows (OPMAP's matmul, batch matmul, attention, quantised and
grouped matmul entries): a measured row's shapes and dtypes -> the npusim op's
parameters. Modelling assumptions are stated next to the reader they belong to."""

from __future__ import annotations

import math
import re

from npusim.calibrate.profile import ProfileRow
from npusim.calibrate.row_fields import Parts, Unmappable, dtype_of, format_of, present, shape_of


def read_matmul(row: ProfileRow) -> dict:
    a, b = shape_of(row, 0, 2), shape_of(row, 1, 2)
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
    if len(out) > 1 and out[-2] != m:  # which is the row: A's m, or the output's?
        raise Unmappable(f"A {a} has {m} rows, its output {out} {out[-2]}")
    dtype = dtype_of(row.input_dtypes, 0, row)
    out_dtype = dtype_of(row.output_dtypes, 0, row, "Output Data Types") if row.output_dtypes else dtype
    params = dict(m=m, n=n, k=k, dtype=dtype, out_dtype=out_dtype, trans_b=trans_b)
    if len(row.input_formats) > 1 and format_of(row.input_formats[1]) == "NZ":
        params["format_b"] = "NZ"
    row_of_n = row.input_shapes[2] if len(row.input_shapes) > 2 else ()
    if bias and row_of_n and row_of_n[-1] == n and math.prod(row_of_n) == n:
        params["bias"] = True
    return params


def read_batch_matmul(row: ProfileRow) -> dict:
    a, b = shape_of(row, 0, 2), shape_of(row, 1, 2)  # 2-D inputs: a batch of one
    params = _gemm(row, a, b)
    if len(b) > 2 and math.prod(b[:-2]) != math.prod(a[:-2]):
        raise Unmappable(f"batch dims of A {a} and B {b} differ (broadcast B is not modelled)")
    return params | dict(batch=math.prod(a[:-2]))


def _attention_shape(row: ProfileRow, i: int) -> tuple[int, int, int, int]:
    """Attention input i as (batch, heads, seq, head_dim). The layout is an op attribute
    msprof does not list: BSND where the row's note names it ("BSND", "[B,S,N,D]"),
    else BNSD is assumed. 3-D (BSH) inputs are refused: their shape does not give the
    head count."""
    shape = shape_of(row, i, 3)
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


def read_attention(row: ProfileRow) -> Parts:
    """Flash attention over [batch, heads, seq, head_dim] q and k/v; one query token per
    sequence is a decode step (npusim's decode_attention)."""
    b, n, sq, d = _attention_shape(row, 0)
    _, nkv, skv, _ = _attention_shape(row, 1)
    dtype = dtype_of(row.input_dtypes, 0, row)
    if sq == 1:
        return [("decode_attention", dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, context=skv, dtype=dtype))]
    return [("flash_attention", dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, seq_q=sq, seq_kv=skv,
                                     causal=_causal(row, sq, skv), dtype=dtype))]


def read_incre_flash_attention(row: ProfileRow) -> dict:
    b, n, sq, d = _attention_shape(row, 0)
    if sq != 1:
        raise Unmappable(f"incremental attention with {sq} query tokens per sequence (decode has 1)")
    _, nkv, skv, _ = _attention_shape(row, 1)
    return dict(batch=b, heads=n, kv_heads=nkv, head_dim=d, context=skv, dtype=dtype_of(row.input_dtypes, 0, row))


def read_quant_matmul(row: ProfileRow) -> Parts:
    """QuantBatchMatmulV3: int8 x1 [.., m, k] @ int8 x2 [.., k, n] -> fp16/bf16, dequantised
    by per-channel scales (a batch of them with a leading dim); a per-token scale (input 4)
    is token_scale, which moves CANN's tile (npusim.ops.matmul_qbmm). # assumption: the
    per-token scale and an int32 bias are applied in the kernel's epilogue at no cost the
    cube's does not already pay."""
    a, b = shape_of(row, 0, 2), shape_of(row, 1, 2)
    params = _gemm(row, a, b, bias=False) | (dict(token_scale=True) if present(row, 4) else {})
    if len(a) > 2:
        return [("batch_matmul", params | dict(batch=math.prod(a[:-2])))]
    return [("matmul", params)]


def read_weight_quant_matmul(row: ProfileRow) -> dict:
    """WeightQuantBatchMatmulV2: x [m, k] (fp16/bf16) @ int8 weight [k, n] with per-channel
    antiquant scales (W8A16). # assumption: an antiquant offset costs nothing beyond the
    scale (x @ (w + o) = x @ w + rowsum(x) * o, applied with the scale per channel)."""
    params = _gemm(row, shape_of(row, 0, 2), shape_of(row, 1, 2), bias=False)
    return params | dict(weight_dtype="int8", bias=present(row, 4))


def _group_sizes(row: ProfileRow, m: int, groups: int) -> tuple[int, ...]:
    """Rows of x per group: the per-group outputs' rows when the kernel writes one output
    per group, else the note's cumulative group_list; without either, assumed equal."""
    outs = row.output_shapes
    if len(outs) == groups and sum(o[0] for o in outs if o) == m:
        return tuple(o[0] if o else 0 for o in outs)
    found = re.search(r"group_list[^\[]*\[([\d, ]+)\]", row.note)
    if found:
        if not re.fullmatch(r" *\d+ *(, *\d+ *)*", found[1]):  # "[32,,64]", "[ ]": int('') failed
            raise Unmappable(f"the note's group_list [{found[1]}]: expected cumulative row counts like [32, 64, 96]")
        ends = [int(v) for v in found[1].split(",")]
        if len(ends) == groups and ends[-1] == m:
            return tuple(e - s for s, e in zip([0, *ends[:-1]], ends))
    if m % groups:
        raise Unmappable(f"GroupedMatmul of {m} rows in {groups} groups: the group sizes are not in the row")
    return (m // groups,) * groups


def read_grouped_matmul(row: ProfileRow) -> dict:
    """GroupedMatmul: x [m, k], weights [E, k, n] (or [E, n, k]), optional bias [E, n]."""
    x, w = shape_of(row, 0, 2), shape_of(row, 1, 3)
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
    dtype = dtype_of(row.input_dtypes, 0, row)
    out_dtype = dtype_of(row.output_dtypes, 0, row, "Output Data Types") if row.output_dtypes else dtype
    bias = dtype_of(row.input_dtypes, 2, row) if present(row, 2) else ""
    return dict(group_sizes=_group_sizes(row, m, groups), k=k, n=n, dtype=dtype, out_dtype=out_dtype,
                trans_b=trans_b, bias=bias)
