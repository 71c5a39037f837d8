"""Softmax over a dim that is not the last: x seen as [A, R, I] (R the reduced dim,
I > 1 the elements after it), CANN's "ARA" case of SoftmaxV2.

Element (a, r, i) sits at (a * R + r) * I + i, so the R values a softmax reduces are
I elements apart and the I columns of one a are independent softmaxes. A tile is
a block of w columns of one a over R rows (or a chunk of them): one strided copy
of R segments of w elements, I elements apart in GM, rows padded to whole 32-byte
blocks in UB. Per tile, in fp32:
- the column maxima and sums are halving trees of elementwise instructions (rows
  r and r + h combined, h halving: log2(R) instructions, R - 1 row operations);
- the maxima and the reciprocal sums are applied to every row by one instruction
  that reads the [w] vector again for each row (Ascend C's repeat stride 0).
When R rows of w columns fit UB (ping and pong), one pass per tile; when R rows of
even one block of columns do not, the rows stream in chunks, three passes per
column block, as the wide softmax does for long rows (npusim.ops.wide_rows): the
maxima, the sums of exp(x - max), then y. When one column block holds the whole
inner dim, a tile packs as many consecutive a as fit (their rows are back to back
in GM), each instruction covering all of them (a repeat stride per a). Tiles are
split over the vector cores in contiguous runs, column block outermost, so a core's
run moves by one tile at a time.
# assumption: a column block of one a stays on one core (its statistics do), so a
# softmax with fewer (a, column block) units than vector cores leaves cores idle
# ([100000, 2] over dim 0 runs on one core); its rows are not split over cores.
"""

from __future__ import annotations

from collections.abc import Callable

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import GmTensor, Mem
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.layout import gm_copy, split_runs
from npusim.ops.vector import UB_BLOCK, cast, vop
from npusim.ops.vector_kernels import (
    TILES_MAX, compress, pipeline_epilogue, pipeline_prologue, tile_kernel, tile_pipeline,
)

F32 = 4


def _tree(op: str, rows: int, q: int, src: int, scratch: int, na: int = 1, slab: int = 0) -> list:
    """Combine `rows` fp32 rows of q elements (q * 4 bytes apart) at src with `op` into
    the first row of scratch (which holds rows // 2 rows): rows [0, h) with rows
    [n - h, n), the middle row of an odd n folded into row 0, until one is left. With
    `na` a packed (a tile of several a), each instruction does it for every a: a's rows
    start `slab` bytes apart at src, its scratch rows (rows // 2) * q * 4 apart."""
    pitch = q * F32
    half = max(1, rows // 2) * pitch  # one a's scratch

    def each(n: int, dst, a, b=None, src_slab: int = slab) -> object:
        levels = ((na, half, src_slab) + ((src_slab,) if b is not None else ()),) if na > 1 else ()
        operands = (a,) if b is None else (a, b)
        return vop(op if b is not None else "copy", n * q * na, "fp32", dst, *operands, pitches=levels,
                   flops=1 if b is not None else 0)

    if rows == 1:
        return [each(1, scratch, src)]
    ops, n, at, at_slab = [], rows, src, slab
    while n > 1:
        h = n // 2
        ops.append(each(h, scratch, at, at + (n - h) * pitch, at_slab))
        if n % 2:
            ops.append(vop(op, q * na, "fp32", scratch, scratch, at + h * pitch,
                           pitches=((na, half, half, at_slab),) if na > 1 else ()))
        at, at_slab, n = scratch, half, h
    return ops


def _buffers(rows: int, q: int, e: int, up: bool, na: int = 1) -> list[tuple[str, int]]:
    """(name, bytes) of the UB buffers a tile of `na` a of `rows` x q columns each needs:
    input and output ping and pong, the fp32 copy (16-bit dtypes), the trees' scratch,
    the maxima, the sums (one row per a) and the ones."""
    tile = na * rows * q
    return ([(f"{side}_{p}", tile * e) for p in (0, 1) for side in ("in", "out")]
            + ([("fp32", tile * F32)] if up else [])
            + [("tree", na * max(1, rows // 2) * q * F32), ("max", q * F32), ("sum", na * q * F32), ("ones", q * F32)])


def _ub_bytes(rows: int, q: int, e: int, up: bool, na: int = 1) -> int:
    """UB the tile's buffers (_buffers) take, each padded to a whole block."""
    return sum(align_up(nbytes, UB_BLOCK) for _, nbytes in _buffers(rows, q, e, up, na))


def _tiling(hw: HwConfig, a_count: int, r: int, inner: int, e: int, up: bool) -> tuple[int, int, int]:
    """(w, rows per tile, a per tile): the widest column block (whole blocks, even over
    the inner dim) with all R rows in UB - a block holding the whole inner dim packs as
    many a as fit, keeping a tile for every vector core; if one block of R rows does
    not fit, one block and the most rows that do."""
    step = UB_BLOCK // e
    ub = hw.aiv.ub_bytes
    if _ub_bytes(r, step, e, up) <= ub:
        w = step
        while w + step <= align_up(inner, step) and _ub_bytes(r, w + step, e, up) <= ub:
            w += step
        chunks = cdiv(inner, w)
        w = align_up(cdiv(inner, chunks), step)
        na = 1
        if chunks == 1:
            most = max(1, cdiv(a_count, hw.aiv_count))
            while na < most and _ub_bytes(r, w, e, up, na + 1) <= ub:
                na += 1
        return w, r, na
    rows = r
    while rows > 1 and _ub_bytes(rows, step, e, up) > ub:
        rows = max(1, rows * ub // _ub_bytes(rows, step, e, up) - 1)
    return step, rows, 1


def softmax_axis_kernel(hw: HwConfig, a_count: int, r: int, inner: int, dtype: str, e: int,
                        x: GmTensor, y: GmTensor):
    """One AIV kernel: softmax over the middle dim of [a_count, r, inner] (module doc)."""
    up = dtype != "fp32"
    w, rows, na = _tiling(hw, a_count, r, inner, e, up)
    col_blocks = cdiv(inner, w)
    tiles = col_blocks * cdiv(a_count, na) * cdiv(r, rows) * (1 if rows == r else 3)  # tile loads, every pass
    if tiles > TILES_MAX:
        raise ProgramError(f"op softmax over a dim of {r} with {a_count} before it and {inner} after: {tiles} tile "
                           f"loads, more than the {TILES_MAX} (2^19) npusim simulates (about a minute)")
    buf = Buffers(hw, "softmax")
    at = {name: buf.alloc(name, Mem.UB, nbytes) for name, nbytes in _buffers(rows, w, e, up, na)}
    sets = [([at[f"in_{p}"]], [at[f"out_{p}"]]) for p in (0, 1)]
    wide, scratch, mx, sm, ones = at.get("fp32"), at["tree"], at["max"], at["sum"], at["ones"]
    row_chunks = [(r0, min(rows, r - r0)) for r0 in range(0, r, rows)]

    def tile(a: int, c: int, r0: int, n: int, work, store: bool, k: int = 1):
        """k a from a (rows r0 .. r0 + n - 1 of each: all of them when k > 1), column block c."""
        cols = min(w, inner - c * w)
        q = align_up(cols, UB_BLOCK // e)  # columns a row takes in UB (whole blocks in both dtypes)
        at = ((a * r + r0) * inner + c * w) * e

        def make(p: int):
            (ub_in,), (ub_out,) = sets[p]
            fp32 = wide if up else ub_in
            ops = [cast(k * n * q, dtype, "fp32", fp32, ub_in)] if up else []
            ops += work(n, q, fp32, ub_out, k)
            stores = [gm_copy(Mem.UB, Mem.GM, ub_out, y.addr + at, cols * e, k * n, q * e, inner * e)] if store else []
            return [gm_copy(Mem.GM, Mem.UB, x.addr + at, ub_in, cols * e, k * n, inner * e, q * e)], ops, stores
        return make

    def per_a(n: int, q: int, k: int, dst_slab: int, stat_slab: int) -> tuple:
        """Pitches of an instruction over k packed a of n rows applying one [q] vector per a
        (stat_slab bytes apart; 0: the same vector for all), the dst's a dst_slab apart."""
        rows_level = (n, q * F32, q * F32, 0)
        return ((k, dst_slab, n * q * F32, stat_slab), rows_level) if k > 1 else (rows_level,)

    def exp_rows(n: int, q: int, fp32: int, maxima: int, k: int = 1, stat_slab: int = 0) -> list:
        sub = vop("sub", k * n * q, "fp32", fp32, fp32, maxima, pitches=per_a(n, q, k, n * q * F32, stat_slab))
        return [sub, vop("exp", k * n * q, "fp32", fp32, fp32)]

    def scale_rows(n: int, q: int, fp32: int, ub_out: int, k: int = 1) -> list:
        """y = exp(x - max) * (1 / sum), cast to the output dtype."""
        ops = [vop("mul", k * n * q, "fp32", fp32 if up else ub_out, fp32, sm,
                   pitches=per_a(n, q, k, n * q * F32, q * F32))]
        return ops + ([cast(k * n * q, "fp32", dtype, ub_out, fp32)] if up else [])

    def one_pass(n: int, q: int, fp32: int, ub_out: int, k: int) -> list:
        """All R rows of k a in the tile: maxima (in the scratch), exp(x - max), sums, y."""
        slab, half = n * q * F32, max(1, n // 2) * q * F32
        ops = _tree("max", n, q, fp32, scratch, k, slab) + exp_rows(n, q, fp32, scratch, k, half)
        ops += _tree("add", n, q, fp32, scratch, k, slab)
        ops.append(vop("div", k * q, "fp32", sm, ones, scratch, pitches=((k, q * F32, 0, half),) if k > 1 else ()))
        return ops + scale_rows(n, q, fp32, ub_out, k)

    def accumulate(first: bool, op: str, stat: int, before) -> Callable:
        """A chunk's tree of `op` folded into `stat` (the first chunk's copied)."""
        def work(n, q, fp32, ub_out, k):
            fold = vop("copy", q, "fp32", stat, scratch, flops=0) if first else vop(op, q, "fp32", stat, stat, scratch)
            return before(n, q, fp32) + _tree(op, n, q, fp32, scratch) + [fold]
        return work

    def apply(n: int, q: int, fp32: int, ub_out: int, k: int) -> list:
        return exp_rows(n, q, fp32, mx) + scale_rows(n, q, fp32, ub_out)

    def chunked(a: int, c: int) -> list:
        """Three passes over the row chunks of one column block of one a."""
        def run(works, store):
            return pipeline_prologue() + tile_pipeline(
                [tile(a, c, r0, n, wk, store) for (r0, n), wk in zip(row_chunks, works)]) + pipeline_epilogue()
        first = [k == 0 for k in range(len(row_chunks))]
        body = run([accumulate(f, "max", mx, lambda n, q, fp32: []) for f in first], False)
        body += run([accumulate(f, "add", sm, lambda n, q, fp32: exp_rows(n, q, fp32, mx)) for f in first], False)
        return body + [vop("div", w, "fp32", sm, ones, sm)] + run([apply] * len(row_chunks), True)

    # tiles: (first a, column block, a in it), column block outermost
    units = [(a, c, min(na, a_count - a)) for c in range(col_blocks) for a in range(0, a_count, na)]
    bodies = []
    for lo, hi in split_runs(len(units), hw.aiv_count):
        body = [vop("dup", w, "fp32", ones, scalar=1.0, flops=0)]
        if len(row_chunks) == 1:
            body += pipeline_prologue() + tile_pipeline(
                [tile(a, c, 0, r, one_pass, True, k) for a, c, k in units[lo:hi]]) + pipeline_epilogue()
        else:
            body += compress([chunked(a, c) for a, c, _ in units[lo:hi]], "i")
        bodies.append(body)
    return tile_kernel("softmax", "softmax", buf.buffers, bodies, [x, y])
