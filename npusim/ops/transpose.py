"""Transpose on the vector cores (AIV): y = x with its dims permuted by `perm`, laid
out contiguously (CANN's Transpose; torch.permute(..).contiguous()).

Like the layout ops (npusim.ops.layout) it moves data rather than computes on it, so
what it costs is its DMA pattern and the UB transpose between them:

- collapse: size-1 dims are dropped and dims adjacent in x that stay adjacent, in
  the same order, in y are merged. [363, 367, 373] perm (2, 0, 1) is then a 2-D
  [133221, 373] transpose; a full reverse keeps every dim.
- what the permutation does at its core is a 2-D transpose between I, x's innermost
  dim (contiguous in x), and O, the dim that is innermost in y; every other dim is
  a batch index (a tile's offset in x and in y).
- a tile is [tb of O, ta of I] at one batch index: MTE2 loads tb segments of ta
  elements (strided by O's stride in x), V transposes it in UB, MTE3 stores ta
  segments of tb elements (strided by I's stride in y). Short segments pay the
  64-byte burst rule: a dim of a few elements innermost in y writes rows of a few
  elements. Tiles run double-buffered, in contiguous runs split over the AIV cores.
- a whole [O, I] core smaller than UB stacks several batch indices along K, the
  longest batch dim, into one tile: one copy per index (each its own DMA, start-up
  and all), one transpose for them all.
"""

from __future__ import annotations

import math
from itertools import chain

from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, Loop, Mem, VecOp, moving
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv, gm_copy_cycles
from npusim.ops.layout import UB_RESERVE, gm_copy, pipeline_kernel, split_runs
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import MAX_DTYPES, UB_BLOCK, numel, one_of, shape_validator
from npusim.ops.vector_kernels import TILES_MAX

# The transpose works on 2-byte elements (int8: bytes); wider ones are planes of these.
PLANE_DTYPE = {1: "int8", 2: "int16"}


def _perm_validator(instance, attribute, value) -> None:
    if not isinstance(value, tuple) or (value and sorted(value) != list(range(len(instance.shape)))):
        raise ValueError(f"'{attribute.name}' must be a permutation of 0..{len(instance.shape) - 1} "
                         f"(empty: swap the last two), got {value!r}")


@frozen
class TransposeParams:
    shape: tuple = param((4096, 4096), "shape of x", validator=shape_validator(min_ndim=2))
    perm: tuple = param((), "y dim i is x dim perm[i] (empty: swap the last two dims)", validator=_perm_validator)
    dtype: str = param("fp16", "element dtype", validator=one_of(MAX_DTYPES))

    @property
    def order(self) -> tuple[int, ...]:
        n = len(self.shape)
        return self.perm or (*range(n - 2), n - 1, n - 2)


@frozen
class _Perm:
    """A collapsed permutation: x has `dims`, y dim i is x dim perm[i]."""

    dims: tuple[int, ...]
    perm: tuple[int, ...]

    @property
    def x_strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each x dim, in x."""
        return tuple(math.prod(self.dims[d + 1:]) for d in range(len(self.dims)))

    @property
    def y_strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each x dim, in y."""
        y = [self.dims[d] for d in self.perm]
        at = {d: math.prod(y[i + 1:]) for i, d in enumerate(self.perm)}
        return tuple(at[d] for d in range(len(self.dims)))

    @property
    def inner(self) -> int:
        """I: x's innermost dim."""
        return len(self.dims) - 1

    @property
    def outer(self) -> int:
        """O: the x dim innermost in y."""
        return self.perm[-1]

    @property
    def batch_dims(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.dims)) if d not in (self.inner, self.outer))

    @property
    def stack_dim(self) -> int | None:
        """K: the longest batch dim, along which tiles whose [O, I] core is whole stack."""
        return max(self.batch_dims, key=lambda d: self.dims[d], default=None)


def collapse(shape: tuple, perm: tuple) -> _Perm:
    """The permutation on the fewest dims that moves the same elements: size-1 dims
    dropped, runs of x dims that follow each other in y (d, d+1, ...) merged."""
    kept = [d for d in range(len(shape)) if shape[d] > 1]
    groups: list[list[int]] = []  # in y order
    for d in (d for d in perm if shape[d] > 1):
        if groups and kept.index(d) == kept.index(groups[-1][-1]) + 1:
            groups[-1].append(d)
        else:
            groups.append([d])
    x_order = sorted(range(len(groups)), key=lambda g: groups[g][0])
    rank = {g: i for i, g in enumerate(x_order)}
    return _Perm(tuple(math.prod(shape[d] for d in groups[g]) for g in x_order),
                 tuple(rank[g] for g in range(len(groups))))


def transpose_ops(n: int, e: int, dst, src) -> list:
    """The UB transpose of a tile of n elements of e bytes, src -> dst."""
    # assumed: Ascend C's Transpose / TransDataTo5HD transpose 16 x 16 blocks of 2-byte
    # elements (int8: of bytes); a 4- or 8-byte element is 2 or 4 two-byte planes, each
    # transposed by its own instruction (the address lists pick the plane's halves), so
    # every byte passes through once. Each is priced as a vector copy of its bytes (the
    # config has no cost of its own for it; trans_data's block moves are priced so too),
    # and partial 16 x 16 blocks at a tile's edge by the elements they hold.
    plane = min(e, 2)
    return [VecOp("copy", n, PLANE_DTYPE[plane], dst, (src,), flops_per_elem=0) for _ in range(e // plane)]


def _copy_cycles(hw: HwConfig, count: int, seg_bytes: int, gm_pitch: int, ub_pitch: int, rate: float) -> float:
    """gm_copy_cycles of `count` pieces of seg_bytes, each rounded out to whole bursts
    (gm_copy merges pieces back to back on both sides into one segment)."""
    if gm_pitch == seg_bytes == ub_pitch:
        count, seg_bytes = 1, count * seg_bytes
    return gm_copy_cycles(hw, align_up(seg_bytes, hw.dma.burst_bytes), count, rate)


def _tiling(g: _Perm, e: int, hw: HwConfig) -> tuple[int, int, int]:
    """(tk, tb, ta): the tile's extents along K, O and I. In and out tiles, ping and
    pong, fill UB; extents short of the whole dim are whole DMA bursts. Among the [tb, ta]
    that fit, the least estimated time per core: tiles per core x (a copy in and a copy
    out, burst-rounded, each as gm_copy_cycles at the core's share of HBM). A whole
    [O, I] core that leaves room stacks tk of them along K (fewer, larger tiles: its
    loads and stores are then a loop of tk copies each)."""
    rows, cols = g.dims[g.outer], g.dims[g.inner]
    xs, ys = g.x_strides, g.y_strides
    batches = numel([g.dims[d] for d in g.batch_dims])
    room = (hw.aiv.ub_bytes - UB_RESERVE) // 4
    step = max(1, hw.dma.burst_bytes // e)
    # spread a small transpose over the cores rather than filling one core's UB
    cap = max(step * step, cdiv(batches * rows * cols, hw.aiv_count))
    best = None
    for tb in chain(range(step, rows, step), (rows,)):  # ascending, lazily: the loop ends once a tile outgrows UB
        pb = align_up(tb * e, UB_BLOCK)
        ta = min(cols, cap // tb, room // tb // UB_BLOCK * UB_BLOCK // e, room // pb)
        if ta < cols:
            ta = ta // step * step
        if ta < 1:
            break
        pa = align_up(ta * e, UB_BLOCK)
        tiles = batches * cdiv(rows, tb) * cdiv(cols, ta)
        active = min(tiles, hw.aiv_count)
        share = hw.hbm_bytes_per_cycle / active
        per_tile = (_copy_cycles(hw, tb, ta * e, xs[g.outer] * e, pa, min(hw.aiv.gm_read_bytes_per_cycle, share))
                    + _copy_cycles(hw, ta, tb * e, ys[g.inner] * e, pb, min(hw.aiv.gm_write_bytes_per_cycle, share)))
        cost = cdiv(tiles, hw.aiv_count) * per_tile
        if best is None or cost < best[0]:
            best = (cost, tb, ta)
    if best is None:
        raise ProgramError(f"transpose: no tile of whole {hw.dma.burst_bytes}-byte DMA bursts (dma.burst_bytes) of "
                           f"{e}-byte elements fits {capacity_text(hw, Mem.UB)} in and out, "
                           "double-buffered")
    _, tb, ta = best
    if g.stack_dim is None or (tb, ta) != (rows, cols):
        return 1, tb, ta
    sub = max(tb * align_up(ta * e, UB_BLOCK), ta * align_up(tb * e, UB_BLOCK))
    return min(g.dims[g.stack_dim], room // sub, max(1, cap // (tb * ta))), tb, ta


def _batch_parts(g: _Perm, tk: int) -> list[tuple[int, int, int]]:
    """(offset in x, offset in y, in elements; sub-tiles) of each tile's batch index, in
    x order: every index of the batch dims, K's in runs of tk."""
    parts = [(0, 0, 1)]
    xs, ys = g.x_strides, g.y_strides
    for d in g.batch_dims:
        run = tk if d == g.stack_dim else 1
        parts = [(ox + i * xs[d], oy + i * ys[d], min(run, g.dims[d] - i) if run > 1 else nk)
                 for ox, oy, nk in parts for i in range(0, g.dims[d], run)]
    return parts


def _stacked(copy: Copy, nk: int, src_step: int, dst_step: int) -> list:
    """`copy` once per stacked sub-tile (a loop moving both ends)."""
    if nk == 1:
        return [copy]
    return [Loop("k", nk, [copy.moved(moving(copy.src_addr, "k", src_step), moving(copy.dst_addr, "k", dst_step))])]


def reference_transpose(p: TransposeParams, x, specs, ctx) -> dict:
    return {"y": x["x"].reshape(p.shape).transpose(p.order)}


@register("transpose", TransposeParams, reference=reference_transpose, ins=("x",), outs=("y",))
def lower_transpose(p: TransposeParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Transpose: y = x permuted by perm, contiguous (tiles transposed in UB)."""
    g = collapse(p.shape, p.order)
    if len(g.dims) < 2:
        raise ProgramError(f"op transpose: perm {p.order} of {p.shape} keeps the element order: nothing to transpose")
    if g.outer == g.inner:
        raise ProgramError(f"op transpose: perm {p.order} of {p.shape} keeps the last dim innermost (a strided copy of "
                           "rows): not modelled")
    e = DTYPE_BYTES[p.dtype]
    n = numel(p.shape)
    x, y = gm.tensor("x", n * e), gm.tensor("y", n * e)
    tk, tb, ta = _tiling(g, e, hw)
    pa, pb = align_up(ta * e, UB_BLOCK), align_up(tb * e, UB_BLOCK)  # UB row pitches of the in and out tiles
    buf = Buffers(hw, "transpose")
    ub_in = [buf.alloc(f"in{k}", Mem.UB, tk * tb * pa) for k in (0, 1)]
    ub_out = [buf.alloc(f"out{k}", Mem.UB, tk * ta * pb) for k in (0, 1)]
    rows, cols = g.dims[g.outer], g.dims[g.inner]
    xs_o, ys_i = g.x_strides[g.outer] * e, g.y_strides[g.inner] * e
    xs_k, ys_k = (0, 0) if g.stack_dim is None else (g.x_strides[g.stack_dim] * e, g.y_strides[g.stack_dim] * e)

    def tile(ox: int, oy: int, nk: int, i: int, j: int):
        nr, nc = min(tb, rows - i * tb), min(ta, cols - j * ta)
        src = x.addr + ox * e + i * tb * xs_o + j * ta * e
        dst = y.addr + oy * e + i * tb * e + j * ta * ys_i

        def make(k: int):
            load = gm_copy(Mem.GM, Mem.UB, src, ub_in[k], nc * e, nr, xs_o, pa)
            store = gm_copy(Mem.UB, Mem.GM, ub_out[k], dst, nr * e, nc, pb, ys_i)
            return (_stacked(load, nk, xs_k, tb * pa), transpose_ops(nk * nr * nc, e, ub_out[k], ub_in[k]),
                    _stacked(store, nk, ta * pb, ys_k))

        return make

    bands, chunks = cdiv(rows, tb), cdiv(cols, ta)
    parts = _batch_parts(g, tk)
    if len(parts) * bands * chunks > TILES_MAX:
        raise ProgramError(f"op transpose of {p.shape}: {len(parts) * bands * chunks} tiles of [{tb}, {ta}], more than "
                           f"the {TILES_MAX} (2^19) npusim simulates (about a minute)")
    per_core = []
    for lo, hi in split_runs(len(parts) * bands * chunks, hw.aiv_count):
        groups: list[list] = []  # one per (batch index, band of O): its tiles move by constant steps
        for t in range(lo, hi):
            band, j = divmod(t, chunks)
            if j == 0 or t == lo:
                groups.append([])
            b, i = divmod(band, bands)
            groups[-1].append(tile(*parts[b], i, j))
        per_core.append(groups)
    kernel = pipeline_kernel("transpose", "transpose", buf, per_core, [x, y])
    ins = [TensorInfo("x", p.shape, p.dtype)]
    outs = [TensorInfo("y", tuple(p.shape[d] for d in p.order), p.dtype)]
    return Lowered(
        op_type="transpose", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(ins[0].nbytes + outs[0].nbytes), unit="vector", inputs=ins, outputs=outs,
    )
