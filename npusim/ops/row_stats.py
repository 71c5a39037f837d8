"""Many short rows per instruction, as CANN's 910B row kernels run them.

A tile of many short rows stays in UB and every instruction covers all of them: a
row's statistic (its max, sum, rstd) sits in one 32-byte block (STAT_BYTES, 8 fp32:
Brcb's layout), the reduction writes one block a row (repeating over the rows), and
the statistics are applied either after a BroadCast of the blocks over the whole tile
(one instruction each) or by instructions repeating over the rows that read each row's
block with a zero stride - no per-row instruction and no scalar round trip (hicann/ops-nn
norm/rms_norm/op_kernel/rms_norm_merge_n.h Compute, reduce_common.h ReduceSumMultiN,
quant/dynamic_quant/op_kernel/dynamic_quant_multi_row.h). Used by npusim.ops.rowwise
(RMSNorm, AddRmsNorm) and npusim.ops.quant (DynamicQuant).
"""

from __future__ import annotations

from npusim.isa.program import VecOp
from npusim.ops.vector import UB_BLOCK, vop

STAT_BYTES = UB_BLOCK
STAT_F32 = STAT_BYTES // 4  # fp32 words of a row's statistic block
# Ascend C's repeat count is an 8-bit field: an instruction repeating over rows covers at
# most this many (rms_norm_merge_n.h repeatByRow's 255; dynamic_quant_tiling.cpp COMPARE_INT)
MAX_REPEATS = 255


def _row_chunks(nr: int):
    """(first row, rows) of each run of at most MAX_REPEATS rows."""
    return [(r0, min(MAX_REPEATS, nr - r0)) for r0 in range(0, nr, MAX_REPEATS)]


def row_reduce(op: str, nr: int, cols: int, pitch: int, stats, src) -> list:
    """Reduce each of nr fp32 rows (`cols` elements, rows `pitch` bytes apart) into its
    row's statistic block at stats + r * STAT_BYTES, one instruction per MAX_REPEATS rows.
    # assumption: the folding Adds/Maxes before WholeReduce (one per 64 columns, each over
    # every row) are priced by the reduce op's cost factor per repeat of the tile"""
    return [vop(op, rows * cols, "fp32", stats + r0 * STAT_BYTES, src + r0 * pitch, out_n=rows * STAT_F32,
                pitches=((rows, STAT_BYTES, pitch),)) for r0, rows in _row_chunks(nr)]


def broadcast_rows(nr: int, cols: int, pitch: int, full, stats) -> VecOp:
    """Ascend C BroadCast of [nr, 1] statistics (one block a row) to a full [nr, cols] fp32
    tile at `full`: one instruction over the tile (cols a multiple of STAT_F32), so the
    statistic is then applied by one elementwise instruction (rms_norm_merge_n.h Compute,
    dynamic_quant_multi_row.h ComputeQuantization)."""
    return vop("copy", nr * cols, "fp32", full, stats, flops=0,
               pitches=((nr, pitch, STAT_BYTES), (cols // STAT_F32, UB_BLOCK, 0)))


def row_stat(op: str, cols: int, dst, src, stat) -> VecOp:
    """dst = src op stat over one fp32 row of `cols` elements, the statistic read from its
    block with stride 0 (one row of DynamicQuant's unaligned tiles)."""
    return vop(op, cols, "fp32", dst, src, stat, pitches=((cols, 4, 4, 0),))


def brcb(nr: int, blocks, values) -> VecOp:
    """Brcb: each of nr contiguous fp32 values into its own statistic block (8 copies)."""
    return vop("copy", nr * STAT_F32, "fp32", blocks, values, flops=0, pitches=((nr, STAT_BYTES, 4), (STAT_F32, 4, 0)))


def over_rows(op: str, nr: int, cols: int, pitch: int, dst, src, vec) -> VecOp:
    """dst[r] = src[r] op vec for nr fp32 rows (`cols` elements, `pitch` bytes apart) and one
    [cols] vector (a norm's weight) read again for every row: one instruction."""
    return vop(op, nr * cols, "fp32", dst, src, vec, pitches=((nr, pitch, pitch, 0),))
