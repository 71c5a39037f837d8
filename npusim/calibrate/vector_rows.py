"""Readers of the vector unit's rows (OPMAP's elementwise, row-wise and norm entries,
softmax, SwiGlu, RoPE, casts, layout changes, copies, gathers, top-k): a measured row's
shapes and dtypes -> the npusim op's parameters. Modelling assumptions are stated next
to the reader they belong to."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from npusim.calibrate.profile import ProfileRow
from npusim.calibrate.row_fields import Parts, Reader, Unmappable, dtype_of, format_of, rows_cols, shape_of
from npusim.hw.parse import plain


def read_rowwise(row: ProfileRow) -> dict:
    """Elementwise and row-wise ops on input 0 as [rows, h]."""
    return dict(shape=rows_cols(shape_of(row, 0)), dtype=dtype_of(row.input_dtypes, 0, row))


def read_last_dim(row: ProfileRow) -> dict:
    """A reduction over the last dim (ArgMax), refused along another."""
    x = shape_of(row, 0)
    dim = _dim(row, x)
    if dim != len(x) - 1:
        raise Unmappable(f"{row.op_type} along dim {dim} of {x} (only the last dim is modelled)")
    return read_rowwise(row)


def norm_reader(weight: int) -> Reader:
    """A norm over the trailing dims its weight (input `weight`) covers: [rows, prod(weight)]."""

    def read(row: ProfileRow) -> dict:
        x = shape_of(row, 0)
        gamma = row.input_shapes[weight] if len(row.input_shapes) > weight and row.input_shapes[weight] else x[-1:]
        if len(gamma) > len(x) or x[len(x) - len(gamma):] != tuple(gamma):
            raise Unmappable(f"{row.op_type} of {x} with a weight of shape {gamma} (input {weight}): "
                             "the weight is not x's trailing dims")
        return dict(shape=(math.prod(x) // math.prod(gamma), math.prod(gamma)),
                    dtype=dtype_of(row.input_dtypes, 0, row))

    return read


def binary_reader(op: str) -> Callable[[ProfileRow], Parts]:
    """Add / Mul of two tensors of one shape (npusim's add, mul), or of a tensor and a
    scalar - a scalar input not listed, or of one element - which is one input stream
    and one simple vector op per element: Muls, and Adds priced as Muls (npusim's
    scale). Other broadcasts are not modelled."""

    def read(row: ProfileRow) -> Parts:
        x = shape_of(row, 0)
        other = row.input_shapes[1] if len(row.input_shapes) > 1 else ()
        if math.prod(other) == 1:
            return [("scale", read_rowwise(row))]
        if other != x:
            raise Unmappable(f"broadcast {x} with {other} (only equal shapes and scalars are modelled)")
        return [(op, read_rowwise(row))]

    return read


def read_maximum(row: ProfileRow) -> dict:
    return dict(shape=shape_of(row, 0), shape2=shape_of(row, 1), dtype=dtype_of(row.input_dtypes, 0, row))


def _attrs(row: ProfileRow) -> dict[str, str]:
    """The call's attributes as the note lists them: "attrs {base: -1.0, scale: 2.0}"
    -> {"base": "-1.0", "scale": "2.0"} ("attrs {}": none)."""
    found = re.search(r"attrs \{([^}]*)\}", row.note)
    if not found:
        return {}
    out = {}
    for item in (x for x in found[1].split(",") if x.strip()):
        key, colon, value = item.partition(":")
        if not colon:
            raise Unmappable(f"the note's attrs {{{found[1]}}}: expected 'name: value' pairs, got '{item.strip()}'")
        out[key.strip()] = value.strip()
    return out


def _number_attrs(row: ProfileRow, names: tuple[str, ...]) -> dict[str, float]:
    """The note's attributes of `names` as finite numbers."""
    out = {}
    for key, text in _attrs(row).items():
        if key not in names:
            continue
        try:
            value = plain(float, text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise Unmappable(f"the note's attribute '{key}': expected a finite number, got '{text}'")
        out[key] = value
    return out


def read_exp(row: ProfileRow) -> dict:
    """Exp: y = base^(scale * x + shift), CANN's attributes (e, 1, 0 unless the note gives them)."""
    keep = _number_attrs(row, ("base", "scale", "shift"))
    return dict(shape=shape_of(row, 0), dtype=dtype_of(row.input_dtypes, 0, row)) | keep


def read_fused_exp(row: ProfileRow) -> dict:
    """AutomaticBufferFusionOp: a kernel the graph engine fused; its ops are in the note
    only. Mapped when the note says it computes exp((scale*x+shift)*ln(base)) - one
    streaming pass, which is npusim's exp with those attributes."""
    if "exp(" not in row.note:
        raise Unmappable("a graph-fused kernel whose ops are not given (only a fused exp is mapped)")
    return read_exp(row)


def read_transpose(row: ProfileRow) -> dict:
    """Transpose: the permutation is read off the input and output shapes; where dims
    repeat (a square matrix) it is assumed to swap the last two."""
    x = shape_of(row, 0)
    y = row.output_shapes[0] if row.output_shapes else ()
    if sorted(y) != sorted(x):
        raise Unmappable(f"Transpose of {x} to {y}: the output is not a permutation of the input")
    if len(set(x)) == len(x):
        perm = tuple(x.index(d) for d in y)
    elif y == x[:-2] + (x[-1], x[-2]):
        perm = tuple(range(len(x) - 2)) + (len(x) - 1, len(x) - 2)
    else:
        raise Unmappable(f"Transpose of {x} to {y}: repeated dims leave the permutation open")
    return dict(shape=x, perm=perm, dtype=dtype_of(row.input_dtypes, 0, row))


def read_dynamic_quant(row: ProfileRow) -> dict:
    """DynamicQuant: per-token int8 quantisation over the last dim (npusim's quantize_per_token)."""
    rows, hidden = rows_cols(shape_of(row, 0))
    return dict(rows=rows, hidden=hidden, dtype=dtype_of(row.input_dtypes, 0, row))


def read_copy(row: ProfileRow) -> dict:
    return dict(n=math.prod(shape_of(row, 0)), dtype=dtype_of(row.input_dtypes, 0, row))


def _dim(row: ProfileRow, x: tuple[int, ...]) -> int:
    """The dim an op works along: the last unless the note's attributes give another
    ("attrs {dim: 0}")."""
    found = re.search(r"dim: *(-?\d+)", row.note)
    if not found:
        return len(x) - 1
    if not -len(x) <= int(found[1]) < len(x):
        raise Unmappable(f"the note's dim {found[1]} is not a dim of input 0 {x}")
    return int(found[1]) % len(x)


def read_softmax(row: ProfileRow) -> dict:
    """Softmax along the note's dim (the last unless it gives another)."""
    x = shape_of(row, 0)
    return dict(shape=x, dtype=dtype_of(row.input_dtypes, 0, row), dim=_dim(row, x) - len(x))


def _split_dim(row: ProfileRow) -> tuple[tuple[int, ...], int]:
    """The input and the dim npu_swiglu splits into gate and up halves (_dim)."""
    x = shape_of(row, 0)
    dim = _dim(row, x)
    if x[dim] % 2:
        raise Unmappable(f"SwiGlu of {x} split on dim {dim} of odd length {x[dim]}")
    return x, dim


def read_swiglu(row: ProfileRow) -> dict:
    """SwiGlu over its split dim: the halves along dim d of [.., D_d, ...] are each one run
    of D_d/2 x (the dims after d) elements per leading index, which is npusim's swiglu of
    shape [prod(dims before d), D_d x prod(dims after d)] (gate and up: the two halves)."""
    x, dim = _split_dim(row)
    return dict(shape=(math.prod(x[:dim]), math.prod(x[dim:])), dtype=dtype_of(row.input_dtypes, 0, row))


def read_slice(row: ProfileRow) -> dict:
    """Slice: one copy of the part it keeps (its output). # assumption: in a row that
    sums Slice and SwiGlu (npu_swiglu; no output shape of its own) it copies one half
    of the input."""
    x = shape_of(row, 0)
    kept = math.prod(row.output_shapes[0]) if "+" not in row.op_type and row.output_shapes else math.prod(x) // 2
    if kept > math.prod(x):  # a slice keeps part of its input: which is the row?
        raise Unmappable(f"Slice of {x} to {row.output_shapes[0]}: the output is larger than the input")
    return dict(n=kept, dtype=dtype_of(row.input_dtypes, 0, row))


def read_cast(row: ProfileRow) -> dict:
    if not row.output_dtypes:
        raise Unmappable("no 'Output Data Types' column: the target dtype is unknown")
    return read_rowwise(row) | dict(out_dtype=dtype_of(row.output_dtypes, 0, row, "Output Data Types"))


def read_rope(row: ProfileRow) -> dict:
    x = shape_of(row, 0, 3)
    return dict(shape=(math.prod(x[:-2]), x[-2], x[-1]), dtype=dtype_of(row.input_dtypes, 0, row))


def read_trans_data(row: ProfileRow) -> dict:
    src = format_of(row.input_formats[0]) if row.input_formats else None
    dst = format_of(row.output_formats[0]) if row.output_formats else None
    if src is None or dst is None or src == dst:
        raise Unmappable("TransData needs input and output formats among ND and FRACTAL_NZ ('Output Formats')")
    nd = shape_of(row, 0) if src == "ND" else (row.output_shapes[0] if row.output_shapes else ())
    if len(nd) < 2:
        raise Unmappable("TransData: no 2-D ND shape among its tensors")
    return dict(shape=rows_cols(nd), dtype=dtype_of(row.input_dtypes, 0, row), src_format=src, dst_format=dst)


def read_top_k(row: ProfileRow) -> dict:
    out = row.output_shapes[0] if row.output_shapes else ()
    if not out:
        raise Unmappable("TopK: no output shape to read k from")
    return read_last_dim(row) | dict(k=out[-1])


def read_gather(row: ProfileRow) -> dict:
    table, ids = shape_of(row, 0, 2), shape_of(row, 1)
    if len(table) != 2:
        raise Unmappable(f"Gather from a table of shape {table} (an embedding table is 2-D)")
    return dict(tokens=math.prod(ids), vocab=table[0], hidden=table[1], dtype=dtype_of(row.input_dtypes, 0, row))
