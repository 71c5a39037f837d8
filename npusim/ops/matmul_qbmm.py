"""W8A8 base tiles as CANN's QuantBatchMatmulV3 picks them on the 910B (its basic tiling).

hicann/ops-nn's QuantBatchMatmulV3 host tiling (matmul/quant_batch_matmul_v3/op_host/
op_tiling/quant_batch_matmul_v3_basic_tiling.cpp) runs, for large int8 shapes, a
basic-block kernel whose base tile it picks by rules, not by a cost model:

- which shapes (CheckUseBasicTiling): one batch, A in ND, and neither M nor N small
  (CheckMNSmallShape: min(m, n) <= 512 and max(m, n) <= 1024 is small); with the
  dequantisation on the vector cores (isUbQuant_: a bf16 C or per-token scales, one MIX
  kernel) M must exceed 256 (CheckIfUseBasicInMix); and the old template's full load
  must not be the better one (CheckNotFullLoadForMutliIterate: min(m, n) > 256, and K of
  1024 or more or a footprint L2 does not hold, and a full-load panel over 448 KiB or one
  reloaded too often or on an unaligned inner axis);
- which tile (SetBase, CompareBase): from 128 x 256 (baseK 128 bytes), every baseM of
  ALL_BASE with every baseN of its list (ND B not transposed: 128 to 1024; transposed B:
  ALL_BASE), while the int32 accumulator fits L0C (baseM * baseN <= 32768)
  and the FixPipe scales fit FB (cube dequant: baseN <= 512), is taken when it loads less
  into L1 (m * ceil(n / baseN) + n * ceil(m / baseM), by 10%), or loads as much with
  as few or fewer rounds and a 256-wide N for an ND B, or (5 rounds or more) a better
  compute to load ratio, or, as wide as the current tile in baseM + baseN, when it
  loads less into L2 in the first round (CheckL2Load: MIX kernels, or pure cube ones
  with K over N, at most 8 or 6 cores on a row or column of tiles) or when m and n are
  within 10% (CheckMTE1: a taller tile, L0A fills twice as fast as L0B).

So the MIX kernels (a bf16 C) often take 256 x 128 tiles where the pure cube kernel
(fp16 C, scales in FixPipe) takes 128 x 256 (1024 x 4096 x 4096: the 256 x 128 tile's
first round reads 4 row panels of A and 24 column panels of B instead of 8 and 12):
an ND B then comes in rows of 128 bytes, not 256.

The kernel never splits K (singleCoreK = K). # assumption: the closed-source knowledge
base (CheckSupportConditionQbmm's Basic and BasicLimit lists, libops legacy) holds none
of the shapes priced here; the L2 tiling (DoL2CacheTiling) and the row/column order the
cores take tiles in are not modelled; npusim deals a core a contiguous run of tiles, as
many rounds as CANN's round-robin.
"""

from __future__ import annotations

from npusim.hw import HwConfig
from npusim.hw.derived import mmad_fractal
from npusim.isa.program import DTYPE_BYTES
from npusim.ops.build import align_up, cdiv

# SetBase's candidates (ALL_BASE, INNER_AXIS_ND_BASE, INNER_AXIS_ALIGN_NZ_BASE) and its
# first tile (BASIC_BLOCK_SIZE_128 x BASIC_BLOCK_SIZE_256)
ALL_BASE = (64, 80, 96, 128, 192, 256, 320, 384, 512)
INNER_ND_BASE = (128, 256, 512, 1024)
INNER_NZ_BASE = (64, 96, 128, 160, 192, 256, 320, 384, 512)
FIRST_TILE = (128, 256)
_ROW, _COL = 1, 2  # ROW_FIRST, COL_FIRST: the order the cores take tiles in


def vector_dequant(p) -> bool:
    """Whether CANN dequantises this W8A8 matmul's C on the vector cores (isUbQuant_: a
    bf16 C or per-token scales) rather than in FixPipe."""
    return p.out_dtype == "bf16" or p.token_scale


def qbmm_basic_applies(p, hw: HwConfig) -> bool:
    """Whether QuantBatchMatmulV3 runs this int8 matmul as its basic-block kernel (module doc)."""
    if p.dtype != "int8" or getattr(p, "batch", 1) != 1 or p.format_a != "ND" or p.n_parts:
        return False
    m, n, k = p.m, p.n, p.k
    if m <= 16 and 13000 <= k <= 18944 and n >= 1500:  # CheckInBasicBenefitsRange
        return True
    if vector_dequant(p) and m <= 256:  # CheckIfUseBasicInMix
        return False
    if p.format_b == "NZ" and not p.trans_b and m <= 64:
        return False  # assumption: the B-NZ decode tiling (ProcessBNZDecode) is not modelled; npusim's chooser
    if not _not_full_load(p, hw):
        return False
    return not (min(m, n) <= 512 and max(m, n) <= 1024)  # CheckMNSmallShape


def _not_full_load(p, hw: HwConfig) -> bool:
    """CheckNotFullLoadForMutliIterate (A never transposed here)."""
    m, n, k = p.m, p.n, p.k
    total = m * k + k * n + m * n * DTYPE_BYTES[p.out_dtype]
    if k < 1024 and total <= hw.l2.l2_bytes * 0.8:  # small K: the old template's full load wins
        return False
    low = min(m, n)
    if low <= 256:
        return False
    full = align_up(low, 16) * align_up(k, 32)
    base = 128 if (m <= n and not p.trans_b) else 64
    if low < 512:
        full = min(full, 128 * align_up(k, 32))
    if full <= 448 * 1024:
        if (cdiv(max(m, n), hw.chip.aic_count * base) - 1) * full > 160 * 1024:
            return False
        inner = k if m <= n else (k if p.trans_b else n)
        return inner % 128 == 0
    return True


def qbmm_basic_base(p, hw: HwConfig) -> tuple[int, int, int]:
    """(base_m, base_n, base_k) of QuantBatchMatmulV3's basic tiling (SetBase, GetBaseK)."""
    m, n, k = p.m, p.n, p.k
    cores = hw.chip.aic_count
    ub = vector_dequant(p)
    nd_b = p.format_b == "ND"
    n_bases = ALL_BASE if p.trans_b else (INNER_ND_BASE if nd_b else INNER_NZ_BASE)
    max_mn = hw.aic.l0c_bytes // 4  # int32 accumulator elements in L0C, one buffer
    f = mmad_fractal(hw, "int8")
    # CANN's int8 grid is 16 x 16 (BLOCK_CUBE); a candidate off the config's fractal grid
    # (80 with its n0 = 32) is one npusim cannot run and is passed over
    # # assumption: it would not have been CANN's choice
    grid = (max(16, f.m0), max(16 if p.trans_b else 32, f.n0))

    def fit(bm, bn):  # ModifyBase: no wider than the matrix needs
        return (align_up(m, grid[0]) if bm > m else bm), (align_up(n, grid[1]) if bn > n else bn)

    def scales_fit(bn):  # CheckBiasAndScale with L0C single-buffered (FixPipe scales in FB; an int32 bias in BT)
        return not (getattr(p, "bias", False) and bn > 256) and not (not ub and bn > 512)

    def dist(mc, nc, order, rounds, used):  # CalcCoreDistribution: (row clash, column clash, rows, columns)
        md, nd = [0] * mc, [0] * nc
        pre = (mc * nc) % used or used
        t = 0
        for i in range(used):
            md[t // nc if order == _ROW else t % mc] += 1
            nd[t % nc if order == _ROW else t // mc] += 1
            t += rounds - 1 if i >= pre else rounds
        return max(md), max(nd), mc - md.count(0), nc - nd.count(0)

    def order(mc, nc, used):  # GetCalcOrder
        o = _COL if n // 5 > m else _ROW
        if used >= 2 and mc % (used // 2) == 0:
            return _COL
        if used >= 2 and nc % (used // 2) == 0:
            return _ROW
        return o

    def clash_l2(bm, bn, rounds, used):
        mc, nc = cdiv(m, bm), cdiv(n, bn)
        d = dist(mc, nc, order(mc, nc, used), rounds, used)
        return max(d[0], d[1]), d[2] * bm + d[3] * bn

    bm, bn = fit(*FIRST_TILE)
    tiles = cdiv(m, FIRST_TILE[0]) * cdiv(n, FIRST_TILE[1])
    used = min(tiles, cores)
    rounds = cdiv(tiles, used)
    clash, first_l2 = clash_l2(bm, bn, rounds, used)
    best_load = m * cdiv(n, bn) + n * cdiv(m, bm)

    for i, cm in enumerate(ALL_BASE):
        if m < cm and i > 0 and m <= ALL_BASE[i - 1]:
            break
        for cn in n_bases:
            if k <= 2048 and cn in (160, 192, 320):
                continue
            tm, tn = fit(cm, cn)
            if max_mn // tm < tn or not scales_fit(tn):
                break
            if (tm, tn) == (bm, bn) or tm % grid[0] or tn % grid[1]:
                continue
            t_tiles = cdiv(m, tm) * cdiv(n, tn)
            t_used = min(t_tiles, cores)
            t_rounds = cdiv(t_tiles, t_used)
            # CheckLoadAndCalcSize: 1 take, 0 look further, -1 drop
            load = m * cdiv(n, tn) + n * cdiv(m, tm)
            if load * 0.9 > best_load:
                continue
            verdict = None
            take = best_load * 0.9 > load
            if t_rounds >= 5:
                basic = m * cdiv(n, bn) + n * cdiv(m, bm)
                take = take or (min(tm, tn) >= 128 and basic * 0.95 > load)
            if take:
                verdict = 1
            else:
                smaller = load < best_load
                best_load = min(best_load, load)
                if nd_b and not p.trans_b and (tn == 256 or (tn == 512 and smaller)):
                    verdict = 1
                elif bm * bn * rounds * 0.9 > tm * tn * t_rounds:
                    verdict = 1
                elif tm * tn * t_rounds <= bm * bn * rounds:
                    verdict = 0
                else:
                    continue
            update = verdict == 1 or (t_rounds >= 5 and bm * bn / (bm + bn) < tm * tn / (tm + tn))
            t_clash = t_first = 0
            if not update and tm + tn == bm + bn:
                t_clash, t_first = clash_l2(tm, tn, t_rounds, t_used)
                if (ub or n < k) and t_first < first_l2 and not (t_clash > (8 if ub else 6) or t_clash // 2 > clash):
                    ratio = max((0.75 if ub else 0.85) * t_clash / clash, 1.3)
                    update = first_l2 / ratio >= t_first
                update = update or (tm < tn and abs(m - n) < 0.1 * n)  # CheckMTE1
            if update:
                bm, bn, used, rounds = tm, tn, t_used, t_rounds
                clash, first_l2 = (t_clash, t_first) if t_first else clash_l2(bm, bn, rounds, used)
    # GetBaseK: the deepest of 1024 ... 32 that half of L0A holds beside half of L0B
    room = min(hw.aic.l0a_bytes // 2 // bm, hw.aic.l0b_bytes // 2 // bn)
    base_k = next(d for d in (1024, 512, 256, 128, 64, 32) if room >= d)
    return bm, bn, base_k
