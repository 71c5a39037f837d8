"""A measured row's fields as the mapping readers (cube_rows, vector_rows) need them:
msprof's dtype and format names as npusim's, input shapes checked for rank and
emptiness, and Unmappable, the error that gives the reason a row cannot be mapped."""

from __future__ import annotations

import math
from collections.abc import Callable

from npusim.calibrate.profile import ProfileRow

# msprof's dtype names (FLOAT16, DT_BF16, FLOAT, ...) and npusim's own (FP16) -> npusim's
DTYPES = {"FLOAT16": "fp16", "FP16": "fp16", "HALF": "fp16", "BF16": "bf16", "BFLOAT16": "bf16",
          "FLOAT": "fp32", "FLOAT32": "fp32", "FP32": "fp32", "INT8": "int8", "UINT8": "uint8",
          "INT16": "int16", "INT32": "int32", "INT64": "int64"}
# msprof's format names (with or without FORMAT_) -> npusim's layouts (FRACTAL_NZ is the
# cube's 16 x 16 fractal layout)
FORMATS = {"ND": "ND", "NCHW": "ND", "NHWC": "ND", "FRACTAL_NZ": "NZ", "NZ": "NZ"}


class Unmappable(Exception):
    """A row the table cannot map; its message is the reason shown in the report."""


Parts = list[tuple[str, dict]]  # (npusim op type, params) of each kernel a row sums, in order
# A reader gets a row and returns the params of its table entry's op, or the Parts the
# row stands for (another op, or several kernels).
Reader = Callable[[ProfileRow], "dict | Parts"]


def dtype_of(names: tuple[str, ...], i: int, row: ProfileRow, what: str = "Input Data Types") -> str:
    if i >= len(names) or not names[i]:
        raise Unmappable(f"no dtype for tensor {i} in '{what}'")
    name = names[i].upper().removeprefix("DT_")
    if name not in DTYPES:
        raise Unmappable(f"dtype {names[i]} not simulated")
    return DTYPES[name]


def format_of(name: str) -> str | None:
    return FORMATS.get(name.upper().removeprefix("FORMAT_"))


def shape_of(row: ProfileRow, i: int, min_rank: int = 1) -> tuple[int, ...]:
    if i >= len(row.input_shapes) or len(row.input_shapes[i]) < min_rank:
        raise Unmappable(f"input {i} needs at least {min_rank} dimension(s), 'Input Shapes' has "
                         f"{';'.join(','.join(map(str, s)) for s in row.input_shapes) or 'none'}")
    if 0 in row.input_shapes[i]:
        raise Unmappable("an empty tensor (a zero dimension)")
    return row.input_shapes[i]


def rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """[.., h] as [rows, h]: row-wise and elementwise ops see their leading dims as rows."""
    return math.prod(shape[:-1]), shape[-1]


def present(row: ProfileRow, i: int) -> bool:
    """Whether optional input i was passed (an empty entry in Input Shapes: it was not)."""
    return i < len(row.input_shapes) and bool(row.input_shapes[i])
