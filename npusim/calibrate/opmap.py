"""CANN op types -> npusim op types and parameters: the one table (OPMAP) calibration
reads profiles through.

Each entry reads a measured row's shapes and dtypes into the parameters of the npusim
op that does the same work. A row that cannot be mapped (an op type not in the table,
a task on the AI CPU, a layout the shapes do not pin down) gets a reason; the caller
counts and lists those rows, it never drops them silently. The entries' readers are in
cube_rows (matmuls, attention) and vector_rows (the rest), the row fields they read in
row_fields; modelling assumptions are stated next to the reader they belong to.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import attrs
from attrs import frozen

from npusim.calibrate.cube_rows import (read_attention, read_batch_matmul, read_grouped_matmul,
                                        read_incre_flash_attention, read_matmul, read_quant_matmul,
                                        read_weight_quant_matmul)
from npusim.calibrate.profile import ProfileRow
from npusim.calibrate.row_fields import Parts, Reader, Unmappable
from npusim.calibrate.timing import KERNELS, METHODS, STEP
from npusim.calibrate.vector_rows import (binary_reader, norm_reader, read_cast, read_copy, read_dynamic_quant,
                                          read_exp, read_fused_exp, read_gather, read_last_dim, read_maximum,
                                          read_rope, read_rowwise, read_slice, read_softmax, read_swiglu,
                                          read_top_k, read_trans_data, read_transpose)

if TYPE_CHECKING:
    from npusim.calibrate.hccl import HcclRow

# task types run by AI cores; AI_CPU and communication tasks are not simulated here
CORE_TASK_TYPES = ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "MIX_AI_CORE", "")


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


# CANN op type -> (npusim op type, reader). The one mapping table.
OPMAP: dict[str, tuple[str, Reader]] = {
    "MatMul": ("matmul", read_matmul),
    "MatMulV2": ("matmul", read_matmul),
    "MatMulV3": ("matmul", read_matmul),
    "BatchMatMul": ("batch_matmul", read_batch_matmul),
    "BatchMatMulV2": ("batch_matmul", read_batch_matmul),
    "QuantBatchMatmulV3": ("matmul", read_quant_matmul),
    "WeightQuantBatchMatmulV2": ("matmul", read_weight_quant_matmul),
    "GroupedMatmul": ("grouped_matmul", read_grouped_matmul),
    "FlashAttentionScore": ("flash_attention", read_attention),
    "PromptFlashAttention": ("flash_attention", read_attention),
    "FusedInferAttentionScore": ("flash_attention", read_attention),
    "FlashAttention": ("flash_attention", read_attention),
    "IncreFlashAttention": ("decode_attention", read_incre_flash_attention),
    "RmsNorm": ("rms_norm", norm_reader(1)),
    "AddRmsNorm": ("add_rms_norm", norm_reader(2)),
    "LayerNorm": ("layer_norm", norm_reader(1)),
    "LayerNormV3": ("layer_norm", norm_reader(1)),
    "LayerNormV4": ("layer_norm", norm_reader(1)),
    "Swiglu": ("swiglu", read_swiglu),
    "SwiGlu": ("swiglu", read_swiglu),
    "RotaryMul": ("rope", read_rope),
    "RoPE": ("rope", read_rope),
    "RotaryPositionEmbedding": ("rope", read_rope),
    "ApplyRotaryPosEmb": ("rope", read_rope),
    "TransData": ("trans_data", read_trans_data),
    "Transpose": ("transpose", read_transpose),
    "Cast": ("cast", read_cast),
    "Add": ("add", binary_reader("add")),
    "AddV2": ("add", binary_reader("add")),
    "Mul": ("mul", binary_reader("mul")),
    "Muls": ("scale", read_rowwise),
    "Maximum": ("maximum", read_maximum),
    "Relu": ("relu", read_rowwise),
    "Gelu": ("gelu", read_rowwise),
    "Swish": ("silu", read_rowwise),
    "Silu": ("silu", read_rowwise),
    "Sigmoid": ("sigmoid", read_rowwise),
    "Exp": ("exp", read_exp),
    "AutomaticBufferFusionOp": ("exp", read_fused_exp),
    "SoftmaxV2": ("softmax", read_softmax),
    "Softmax": ("softmax", read_softmax),
    "DynamicQuant": ("quantize_per_token", read_dynamic_quant),
    "ArgMaxV2": ("argmax", read_last_dim),
    "ArgMax": ("argmax", read_last_dim),
    "TopK": ("top_k", read_top_k),
    "TopKV2": ("top_k", read_top_k),
    "GatherV2": ("embedding", read_gather),
    "copy_": ("copy", read_copy),
    "Slice": ("copy", read_slice),
}

# npusim's own op_summary (npusim run / op --profile) names each op by its npusim type:
# read by the first entry of the table that maps to it (the plain CANN op it stands for)
for _op, _read in reversed(list(OPMAP.values())):
    OPMAP[_op] = (_op, _read)


# The most kernels one row may sum: each is simulated back to back on every trial config
# (Mul×64 fits in 3 s; the public rows sum at most 4). "Mul×99999999999" in a note built
# a list of 10^11 names, and Mul×2000 ran for minutes.
MAX_ROW_KERNELS = 64


def _kernel_list(row: ProfileRow, names: list[str]) -> list[str]:
    """The kernels a "+" row sums, in order: each name of its OP Type as many times as
    the note's kernel list counts it ("kernels: Mul×2 + Add×1 + Exp×1"), once without."""
    counts = dict(re.findall(r"(\w+)×(\d+)", row.note.split("kernels:")[-1])) if "kernels:" in row.note else {}
    counts = {name: int(counts.get(name, 1)) for name in names}
    zero = next((name for name, n in counts.items() if n < 1), None)
    if zero:  # the OP Type names it, the note counts none of it: which is the row?
        raise Unmappable(f"the note's kernel list counts {zero}×0, but OP Type {row.op_type} names it")
    total = sum(counts[name] for name in names)
    if total > MAX_ROW_KERNELS:
        raise Unmappable(f"{total} kernels in one row (OP Type and the note's kernel list), more than the "
                         f"{MAX_ROW_KERNELS} a row may sum")
    return [name for name in names for _ in range(counts[name])]


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
        if not (row.npusim_kernel.isascii() and row.npusim_kernel.isdigit()):  # '²' is a digit int() refuses
            raise Unmappable(f"column 'npusim Kernel': expected the kernel's index (0, 1, ...), got "
                             f"'{row.npusim_kernel}'")
        if row.step:  # a decoder step's: that kernel as it ran in the step, with what ran beside it
            params = json.dumps(_own_params(row), sort_keys=True)  # the step checks that it ran the node so
            return Mapped(row, STEP, (("node", row.npusim_node), ("op", row.npusim_op), ("params", params),
                                      ("step", row.step)), (), KERNELS, int(row.npusim_kernel))
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
