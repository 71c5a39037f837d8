"""MatMul's tiling chooser: the base tile (base_m x base_n), base_k and K split a
matmul runs with when none is given, picked by a small cost model (choose_tiling), with
CANN's own rules where npusim follows them (MatMulV3's load balance: balanced_base_m;
QuantBatchMatmulV3's basic tiling: npusim.ops.matmul_qbmm). npusim.ops.matmul holds the
tiling record (MatmulTiling) and lowers with it; grouped_matmul prices its tiles with
this cost model too (unit_cycles).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from npusim.hw import HwConfig
from npusim.hw.derived import mmad_fractal
from npusim.isa.program import DTYPE_BYTES, addr, off_line_share
from npusim.ops.build import align_up, cdiv, gm_copy_cycles
from npusim.ops.matmul_program import _b_dtype, _part_starts
from npusim.ops.matmul_qbmm import qbmm_basic_applies, qbmm_basic_base

if TYPE_CHECKING:
    from npusim.ops.matmul import MatmulParams, MatmulTiling

# The largest tile the tiling choosers pick: its fp32 accumulator fills L0C (128 x 256 x 4
# = 128 KiB) and two of its base_k slices of B (128 bytes of K each, any dtype) fill L0B.
MAX_BASE_M, MAX_BASE_N = 128, 256
# The choosers' K blocking: a base_k slice is this many bytes of A deep (CANN's basic block:
# baseK = 128 bytes whatever the dtype, MatMulV3's and QuantBatchMatmulV3's basic tilings,
# BASIC_BLOCK_K_128_BYTE), an L1 chunk this many slices.
SLICE_BYTES, STEP_K = 128, 4


def choose_tiling(p: MatmulParams, hw: HwConfig) -> MatmulTiling:
    """Pick base tiles and a K split by a small cost model: per core, waves of work
    units each costing max(cube cycles, load cycles at the core's port)."""
    from npusim.ops.matmul import MatmulTiling  # here: npusim.ops.matmul imports this module

    cores = hw.chip.aic_count
    batch = getattr(p, "batch", 1)
    f = mmad_fractal(hw, p.dtype)
    e, eb = DTYPE_BYTES[p.dtype], DTYPE_BYTES[_b_dtype(p)]
    base_k = slice_depth(hw, p.dtype)
    if qbmm_basic_applies(p, hw):  # W8A8 as QuantBatchMatmulV3's basic kernel: its tile rules, K never split
        bm, bn, bk = qbmm_basic_base(p, hw)  # assumption: npusim's L1 chunks (STEP_K slices), not CANN's stepKa/Kb
        units = cdiv(p.m, bm) * cdiv(p.n, bn)
        return MatmulTiling(base_m=bm, base_n=bn, base_k=bk, step_k=STEP_K, split_k=1,
                            a_resident=cdiv(p.m, bm) < units and panel_fits(bm, p.k, e, hw),
                            block_dim=min(cores, units))
    base_m = min(MAX_BASE_M, align_up(p.m, f.m0))
    m_tiles = cdiv(p.m, base_m)
    best = None
    tiles = batch * m_tiles * cdiv(p.n, min(MAX_BASE_N, align_up(p.n, f.n0)))
    parts = _part_starts(p)
    write = gm_copy_cycles(hw, 0, base_m, math.inf, cube=True)  # one FixPipe write of a tile: its DMA costs, not its bytes
    floor = batch * (p.m * p.k * e + p.k * p.n * eb + p.m * p.n * DTYPE_BYTES[p.out_dtype]) / hw.hbm_bytes_per_cycle
    for base_n, split_k in itertools.product(tile_widths(p.n, f), (1, 2, 3, 4, 6, 8)):
        if split_k > max(1, p.k // (base_k * STEP_K)):
            continue
        if split_k > 1 and tiles >= cores:  # split K only when the tiles cannot fill the cores
            continue
        # the 128 x 256 basic block is costed with the rows CANN's load balancing gives it
        bm = balanced_base_m(p, hw, base_m, base_n, split_k)
        units = batch * cdiv(p.m, bm) * cdiv(p.n, base_n) * split_k
        unit = unit_cycles(hw, f, bm, base_n, cdiv(p.k, split_k), base_k, e, eb, off_lines(p, hw, base_n))
        # a part boundary inside a tile costs that tile one more FixPipe write, which
        # holds L0C (single-buffered), so it adds to the unit (spread over the N tiles)
        extra = sum(1 for s, _ in parts[1:] if s % base_n)
        cost = cdiv(units, min(units, cores)) * (unit + extra / cdiv(p.n, base_n) * write)
        # every byte of A, B and C crosses HBM once whatever the tiling: a tiling whose
        # cores wait for HBM is no faster than this (ties go to the widest tile, the
        # first tried); a K split adds the start of the kernel that zeroes C
        cost = max(cost, floor) + (split_k > 1) * hw.runtime.kernel_start_aiv_cycles
        if best is None or cost < best[0]:
            best = (cost, bm, base_n, split_k, units)
    _, base_m, base_n, split_k, units = best
    return MatmulTiling(
        base_m=base_m, base_n=base_n, base_k=base_k, step_k=STEP_K, split_k=split_k,
        a_resident=cdiv(p.m, base_m) * batch < units and panel_fits(base_m, p.k, e, hw),
        block_dim=min(cores, units),
    )


# CANN MatMulV3's load balancing of its basic kernel (matmul/mat_mul_v3/op_host/op_tiling/
# matmul_v3_base_tiling.cpp, OptimizeLoadBalanceBasicKernel): it applies on 24-core chips only
# ("暂时适用于24核情况"), to the 128 x 256 block (baseM * baseN == 32768, baseK 128 bytes), and
# adjusts baseM only (baseN is C's inner axis, kept for its 512 B rows).
BALANCE_CORES, BALANCE_ROUNDS, BALANCE_M = 24, 4, (128, 672)


def balanced_base_m(p: MatmulParams, hw: HwConfig, base_m: int, base_n: int, split_k: int) -> int:
    """base_m as CANN MatMulV3's host tiling balances it (OptimizeLoadBalanceBasicKernel):
    with the 128 x 256 block on a 24-core chip, if the m x n tiles make fewer than 4 rounds
    of the cores, the tile count is rounded up to a multiple of the cores and base_m cut to
    share m among that many rows of tiles: mCore = ceil_to(mCore * nCore, cores) // nCore,
    base_m = align16(ceil(m / mCore)) (1024^3: 8 x 4 tiles of 128 -> 11 x 4 of 96, two
    rounds of 96-row tiles instead of 128). Otherwise, with 128 < m <= 672, base_m shrinks
    by 16 while the rows of tiles stay as many (less padding in the last row). The
    kernel deals the tiles in rounds over the cores (mat_mul_base_block.h: round, preCoreNum);
    it does not split tiles, so balancing is all in this choice of base_m."""
    # Assumed to be MatMulV3 only: batch_matmul (BatchMatMulV3 tiles batches itself), W8A8 and
    # W8A16 (QuantBatchMatmulV3 / WeightQuantBatchMatmulV2, their own basic tiling) keep base_m.
    # CANN gates the rule on the base kernel (no full load, no split K: split_k 1 here) and on
    # A not transposed (npusim's A never is); its 128-byte baseK is npusim's base_k for fp16,
    # bf16 and fp32 (4 fractals of k0), so that check always holds here.
    # Assumed: fewer than 24 tiles of 128 x 256, or m or n under 256, CANN first takes its
    # small-shape path (FormulaicBaseBlockTiling: CalcBase over {128x256, 128x128, 64x512},
    # baseM = align16(m // (cores // nCnt))); for the 256-wide block that is this same cut
    # (512 x 1040 x 1024: 96 x 256 either way), so npusim uses this rule there too and
    # leaves the other widths to its own cost model. Only base_m is touched: npusim's
    # base_m starts at min(128, m) where CANN's starts at 128, so m < 128 is never cut.
    if (getattr(p, "batch", 1) != 1 or p.dtype == "int8" or _b_dtype(p) == "int8" or split_k != 1
            or hw.chip.aic_count != BALANCE_CORES or base_m * base_n != MAX_BASE_M * MAX_BASE_N):
        return base_m
    cores = hw.chip.aic_count
    m_core, n_core = cdiv(p.m, base_m), cdiv(p.n, base_n)
    if m_core * n_core < BALANCE_ROUNDS * cores:  # "4为经验值，轮次更多得情况下均衡收益变小"
        m_core = align_up(m_core * n_core, cores) // n_core
        return align_up(cdiv(p.m, m_core), 16)  # BASIC_BLOCK_SIZE_16, whatever the dtype's m0 (16 for all)
    if BALANCE_M[0] < p.m <= BALANCE_M[1]:  # "经验值，m再大调整意义不大"
        while base_m > 16 and cdiv(p.m, base_m - 16) == m_core:
            base_m -= 16
    return base_m


def slice_depth(hw: HwConfig, dtype: str) -> int:
    """The choosers' base_k: SLICE_BYTES of A's dtype, on the dtype's fractal k0 (fp16 and
    bf16: 64, fp32: 32, int8: 128). CANN's basic tilings take baseK as 128 bytes for every
    dtype (quant_batch_matmul_v3_basic_tiling.cpp: baseK = GetShapeWithDataType(
    BASIC_BLOCK_K_128_BYTE, aDtype), 128 for int8; its GetBaseK picks the deepest K that half
    of L0A and L0B hold, 128 too for the 128 x 256 int8 block): an int8 slice holds as many
    bytes as an fp16 one, so it is twice as many elements deep and a tile over K pays half
    as many Mmad start-ups."""
    return align_up(SLICE_BYTES // DTYPE_BYTES[dtype], mmad_fractal(hw, dtype).k0)


def tile_widths(n: int, f) -> list[int]:
    """The base_n the tiling choosers try, widest first: multiples of the fractal's n0
    from MAX_BASE_N down, none wider than n needs (MAX_BASE_N itself cut to n)."""
    need = align_up(n, f.n0)
    return [min(w, need) for w in range(MAX_BASE_N, f.n0 - 1, -f.n0) if w <= need or w == MAX_BASE_N]


def panel_fits(base_m: int, k: int, e: int, hw: HwConfig) -> bool:
    """Whether a tile row's whole A panel (base_m x k) may stay resident in L1: it takes
    at most a quarter of L1, leaving the rest to the B chunks' ping-pong."""
    return base_m * k * e <= hw.aic.l1_bytes // 4


def unit_cycles(hw: HwConfig, f, bm: int, bn: int, k_piece: int, base_k: int, e: int, eb: int,
                off: tuple[float, float] = (0.0, 0.0)) -> float:
    """The tiling choosers' estimate of one work unit (a bm x bn tile over k_piece of
    K, in L1 chunks of STEP_K base_k slices): max(cube cycles, load cycles at the
    core's GM port), as double buffering overlaps the two. off: the shares of A's and
    B's chunk rows that start off an L2 line (off_lines)."""
    kc = base_k * STEP_K
    chunks = cdiv(k_piece, kc)
    cube = (cdiv(bm, f.m0) * cdiv(bn, f.n0) * cdiv(k_piece, f.k0)
            + cdiv(k_piece, base_k) * hw.aic.mmad_startup_cycles)
    port = hw.aic.gm_read_bytes_per_cycle
    load = chunks * (gm_copy_cycles(hw, kc * e, bm, port, cube=True, off_line=off[0])
                     + gm_copy_cycles(hw, bn * eb, kc, port, cube=True, off_line=off[1]))
    return max(cube, load)


def off_lines(p: MatmulParams, hw: HwConfig, base_n: int) -> tuple[float, float]:
    """The shares of an ND A's and B's L1 chunk rows whose GM start is off an L2 line
    with tiles base_n wide (as the engine finds them: off_line_share); NZ operands move
    whole fractal columns and count as on a line. A row of A starts at a multiple of
    its K chunk; one of B at a multiple of base_n columns (of the K chunk with trans_b)."""
    line, kc = hw.l2.line_bytes, slice_depth(hw, p.dtype) * STEP_K
    e, eb = DTYPE_BYTES[p.dtype], DTYPE_BYTES[_b_dtype(p)]
    a = off_line_share(addr(0, k=kc * e), 2, p.k * e, line) if p.format_a == "ND" else 0.0
    if p.format_b == "NZ":
        return a, 0.0
    step, stride = (kc * eb, p.k * eb) if p.trans_b else (base_n * eb, p.n * eb)
    return a, off_line_share(addr(0, n=step), 2, stride, line)


__all__ = ["MAX_BASE_M", "MAX_BASE_N", "SLICE_BYTES", "STEP_K", "balanced_base_m", "choose_tiling", "off_lines",
           "panel_fits", "slice_depth", "tile_widths", "unit_cycles"]
