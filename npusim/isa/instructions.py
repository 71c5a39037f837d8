"""The instruction table: what the instructions of the program IR do to the data.

One place that says, per instruction kind, what it reads and writes and how: the
conversions a Copy may make on the way (CONVERSIONS), the vector ops by name with
their operands (VECTOR_OPS: sources, a scalar operand, reduction or not), the local
layouts Mmad reads and writes (below) - the contract the functional interpreter
(isa.interpret, `npusim validate --kernels`) runs by, and verify's reach of a
strided vector operand (vec_spans). The engine prices the same records from their
sizes alone: none of these fields changes a cost.

Local data layouts the cube instructions assume (the matmul lowering's):
- L1 and L0A hold a [rows, cols] operand as 16-column fractal blocks ("NZ"): block j
  holds columns 16j..16j+15 of every row, row-major inside the block, blocks back to
  back (block j at j * rows * 16 elements).
- L0B holds B [k, n] the same way, but each block starts on an L0B alignment
  boundary (block j at j * align_up(k * 16 * elem, 512) bytes).
- L0C holds C [m, n] row-major in the accumulator dtype (fp32; int32 for int8
  inputs), each row padded to whole 16-column fractals.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from attrs import frozen

from npusim.isa.program import ALIGN_BYTES, DTYPE_BYTES, Mem, VecOp

FRACTAL_COLS = 16  # columns of a fractal block in L1/L0A/L0B and of an L0C row's padding
ACC_DTYPES = {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32", "int8": "int32"}  # L0C's dtype per Mmad dtype


# ------------------------------------------------------------------ copy conversions


@frozen
class Conversion:
    """What a Copy's `convert` does to the data: `kind` and the element dtype or width."""

    kind: str  # "bytes", "nd2nz", "dn2nz", "fix"
    dtype: str  # the element dtype (nd2nz/dn2nz: by width) or FixPipe's output dtype
    help: str


_WIDTH = {8: "int8", 16: "fp16", 32: "fp32"}  # an element width's stand-in dtype (only its bytes matter)
# A conversion may end in ":R": the segments are groups of R rows, each group its own NZ tile
# (a FlashAttention P of several sub-tiles), the groups back to back. An nd2nz may end in
# "@R": the segments are rows of an NZ tile of R rows, from the row the dst address is at
# in its first block (a run of V's keys from a paged cache).
CONVERSIONS: dict[str, Conversion] = {"": Conversion("bytes", "uint8", "segments copied byte for byte")}
for _bits, _dt in _WIDTH.items():
    CONVERSIONS[f"nd2nz_b{_bits}"] = Conversion(
        "nd2nz", _dt, f"MTE2 ND -> NZ ({_bits}-bit elements): segment i is row i of a [segments, nbytes/elem] "
        "tile; it lands as 16-column fractal blocks of `segments` rows (dst stride unused)")
    CONVERSIONS[f"dn2nz_b{_bits}"] = Conversion(
        "dn2nz", _dt, f"MTE2 transposed ND -> NZ ({_bits}-bit elements): segment i is column i of a "
        "[nbytes/elem, segments] tile (a [n, k] weight read as B [k, n]); it lands as 16-column fractal blocks")
CONVERSIONS["nz_rows"] = Conversion(
    "undescribed", "uint8", "some columns of an NZ tile from inside a fractal block (a run of K's keys from a "
    "paged cache): where they land is not described")
for _dt in ("fp16", "bf16", "fp32"):
    CONVERSIONS[f"fix_{_dt}"] = Conversion(
        "fix", _dt, f"FixPipe L0C -> GM/L1: each segment's nbytes/{DTYPE_BYTES[_dt]} fp32 accumulator values "
        f"(src stride apart) converted to {_dt}")
    CONVERSIONS[f"fix_add_{_dt}"] = Conversion(
        "fix_add", _dt, f"FixPipe's atomic add: as fix_{_dt}, added to the {_dt} values at the destination "
        "(a split-K piece's partial sum)")
CONVERSIONS["fix_s32_fp32"] = Conversion(
    "fix_s32", "fp32", "FixPipe L0C -> GM: each segment's nbytes/4 int32 accumulator values (an int8 Mmad's, no "
    "scales applied) converted to fp32")


def parse_convert(convert: str) -> tuple[Conversion, int, int] | None:
    """A Copy's `convert` read: (its Conversion, the R of "@R", the R of ":R"; 0 where it has
    none), or None if it names no conversion or an R is not a whole number >= 1."""
    name, _, group = convert.partition(":")
    name, _, tile_rows = name.partition("@")
    conv = CONVERSIONS.get(name)
    counts = []
    for text in (tile_rows, group):
        if text and not (text.isascii() and text.isdigit() and int(text) >= 1):
            return None
        counts.append(int(text) if text else 0)
    return None if conv is None else (conv, *counts)


# ------------------------------------------------------------------ vector ops


@frozen
class VectorKind:
    """A vector op's semantics: `arity` UB sources of n elements, a `scalar` operand
    (VecOp.scalar or scalar_src) or not, and `fn(srcs, scalar) -> result` on float32
    (or int) numpy arrays; `reduce`: out_n groups of n/out_n elements -> one value each.
    `bits_out`: the result is one bit per element (a mask), packed from bit 0 of the
    first byte in the order the elements are enumerated (VecOp.pitches' order), written
    contiguously at dst (out_n = ceil(n / 8) bytes; dst pitches unused). `mask_in`: the
    last source is such a mask of n bits, contiguous."""

    arity: int
    fn: Callable
    scalar: bool = False
    reduce: bool = False
    bits_out: bool = False
    mask_in: bool = False


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return a / b


def _exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x)


VECTOR_OPS: dict[str, VectorKind] = {
    "add": VectorKind(2, lambda s, k: s[0] + s[1]),
    "sub": VectorKind(2, lambda s, k: s[0] - s[1]),
    "mul": VectorKind(2, lambda s, k: s[0] * s[1]),
    "div": VectorKind(2, lambda s, k: _div(s[0], s[1])),
    "max": VectorKind(2, lambda s, k: np.maximum(s[0], s[1])),
    "min": VectorKind(2, lambda s, k: np.minimum(s[0], s[1])),
    "adds": VectorKind(1, lambda s, k: s[0] + k, scalar=True),
    "muls": VectorKind(1, lambda s, k: s[0] * k, scalar=True),
    "exp": VectorKind(1, lambda s, k: _exp(s[0])),
    "rsqrt": VectorKind(1, lambda s, k: _rsqrt(s[0])),
    "sqrt": VectorKind(1, lambda s, k: np.sqrt(s[0])),
    "relu": VectorKind(1, lambda s, k: np.maximum(s[0], 0)),
    "abs": VectorKind(1, lambda s, k: np.abs(s[0])),
    "copy": VectorKind(1, lambda s, k: s[0]),
    "cast": VectorKind(1, lambda s, k: s[0]),  # the conversion is the store into out_dtype
    "dup": VectorKind(0, lambda s, k: k, scalar=True),
    # Ascend C Compare(dst, src0, src1, CMPMODE::LE): bit i set where src0[i] <= src1[i]
    # (the causal mask: a key index <= its row's limit - the key is visible)
    "compare": VectorKind(2, lambda s, k: s[0] <= s[1], bits_out=True),
    # Ascend C Select(dst, mask, src0, scalar, VSEL_TENSOR_SCALAR_MODE): src0 where the bit is set, else the scalar
    "select": VectorKind(2, lambda s, k: np.where(s[1], s[0], k), scalar=True, mask_in=True),
    "reduce_sum": VectorKind(1, lambda s, k: np.sum(s[0], axis=-1), reduce=True),
    "reduce_max": VectorKind(1, lambda s, k: np.max(s[0], axis=-1), reduce=True),
}


# Vector ops the interpreter knows the kernels use but the IR does not describe yet: why.
UNDESCRIBED_OPS = {
    "gather": "argmax: it moves each row's index out of ReduceMax's (value, index) record; the IR says neither that "
              "reduce_max computes the index (calIndex) nor how the index (bits in a slot of the logits' dtype) "
              "becomes int32",
    "mrgsort": "the sort's pairs are not described", "sort32": "the sort's pairs are not described",
}


def vec_spans(v: VecOp) -> tuple[int, tuple[int, ...]]:
    """Bytes from each operand's address to the end of what it touches: (dst, (src, ...)).
    Contiguous operands: their elements; with pitches, the farthest element (see VecOp)."""
    dst, srcs = _spans(v)
    kind = VECTOR_OPS.get(v.op)
    if kind is not None and len(v.srcs) == kind.arity:  # a mask is n bits, contiguous
        if kind.bits_out:
            dst = -(-v.n // 8)
        if kind.mask_in:
            srcs = (*srcs[:-1], -(-v.n // 8))
    return dst, srcs


def _spans(v: VecOp) -> tuple[int, tuple[int, ...]]:
    out_n = v.n if v.out_n is None else v.out_n
    e, eo = DTYPE_BYTES[v.dtype], DTYPE_BYTES[v.out_dtype or v.dtype]
    if not v.pitches:
        return out_n * eo, tuple(v.n * e for _ in v.srcs)
    runs = 1
    for level in v.pitches:
        runs *= level[0]
    run = v.n // runs if runs else 0

    def reach(k: int) -> int:  # operand k (0 dst, 1.. srcs): its last run's start
        return sum((level[0] - 1) * level[1 + k] for level in v.pitches if len(level) > 1 + k)

    kind = VECTOR_OPS.get(v.op)
    if kind is not None and kind.reduce:  # pitches[0] counts the rows; each fills out_n / rows elements
        rows, pitch = v.pitches[0][0], v.pitches[0][1]
        return (rows - 1) * pitch + out_n // rows * eo, tuple(reach(1 + i) + run * e for i in range(len(v.srcs)))
    return reach(0) + run * eo, tuple(reach(1 + i) + run * e for i in range(len(v.srcs)))


def l0b_block_bytes(k: int, elem: int) -> int:
    """Bytes from one 16-column block of B in L0B to the next (see the module doc)."""
    return -(-k * FRACTAL_COLS * elem // ALIGN_BYTES[Mem.L0B]) * ALIGN_BYTES[Mem.L0B]


__all__ = ["ACC_DTYPES", "CONVERSIONS", "FRACTAL_COLS", "UNDESCRIBED_OPS", "VECTOR_OPS", "Conversion", "VectorKind",
           "l0b_block_bytes", "parse_convert", "vec_spans"]
