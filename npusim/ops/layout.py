"""Layout operators on the vector cores (AIV): trans_data and embedding (and the
shared tile-pipeline pieces npusim.ops.kv_cache's kv_cache_write uses too).

These move data rather than compute on it, so what they cost is their DMA pattern:
how many segments, how long, how aligned. Each is a custom tile pipeline
(`vector_kernels.tile_pipeline`): per core a list of tiles, each loaded by MTE2,
rearranged in UB by V where the layout needs it, and stored by MTE3, double
buffered; runs of tiles that move by constant steps become loops.

- trans_data ND <-> NZ: NZ keeps a [rows, cols] matrix as column blocks of c0
  elements (16 for fp16: 16 x 16 fractals), each block holding every (padded) row
  contiguously - the cube's operand layout. A tile of ND rows becomes one
  segment per column block on the NZ side, strided by a whole column block.
- embedding: a gather, one DMA per token row.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, GmTensor, Loop, Mem, Pipe, SetFlag, VecOp, WaitFlag, moving
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv, gm_copy_cycles
from npusim.ops.reference import eltwise
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import UB_BLOCK, numel, one_of, shape_validator
from npusim.ops.vector_kernels import (
    compress, pipeline_epilogue, pipeline_prologue, tile_kernel, tile_pipeline,
)

_pos = validators.gt(0)
# UB kept free of tile buffers for alignment padding and small per-core tables.
UB_RESERVE = 1024


def gm_copy(src: Mem, dst: Mem, src_addr, dst_addr, nbytes: int, segments: int = 1,
            src_stride: int | None = None, dst_stride: int | None = None) -> Copy:
    """A Copy of `segments` pieces; pieces back to back on both sides are one segment
    (one DMA burst train, as the hardware would issue it)."""
    ss = nbytes if src_stride is None else src_stride
    ds = nbytes if dst_stride is None else dst_stride
    if segments == 1 or (ss == nbytes and ds == nbytes):
        return Copy(src, dst, src_addr, dst_addr, nbytes * segments)
    return Copy(src, dst, src_addr, dst_addr, nbytes, segments, ss, ds)


def split_runs(units: int, cores: int) -> list[tuple[int, int]]:
    """Contiguous (first, end) runs of units, one per core, as even as whole units allow."""
    per = cdiv(units, cores)
    return [(s, min(units, s + per)) for s in range(0, units, per)]


def pipeline_kernel(name: str, op: str, buf: Buffers, per_core: list[list], gm: list[GmTensor],
                     direct: bool = False, head=lambda core: [], period: int = 1, alike=lambda core: 0) -> object:
    """Kernel from per-core lists of tile groups (each group a list of tile fns whose
    tiles move by constant steps, or runs of `period` tiles do: tile_pipeline);
    head(core) -> instructions before the pipeline; alike(core): tile_pipeline's
    `alike` for each of the core's groups."""
    bodies = []
    for core, groups in enumerate(per_core):
        body = head(core) + pipeline_prologue(direct)
        body += compress([tile_pipeline(g, direct, period, alike(core)) for g in groups], "i")
        bodies.append(body + pipeline_epilogue(direct))
    return tile_kernel(name, op, buf.buffers, bodies, gm)


# ================================================================ trans_data


@frozen
class TransDataParams:
    shape: tuple = param((4096, 4096), "logical shape [.., rows, cols]", validator=shape_validator(min_ndim=2))
    dtype: str = param("fp16", "element dtype", validator=one_of(("fp16", "bf16", "fp32", "int8")))
    src_format: str = param("ND", "layout read: ND (row-major) or NZ (16 x c0 fractals)",
                            validator=one_of(("ND", "NZ")))
    dst_format: str = param("NZ", "layout written: ND or NZ", validator=one_of(("ND", "NZ")))


@frozen
class _Nz:
    """Geometry of a [batch, rows, cols] tensor and its NZ form."""

    batch: int
    rows: int
    cols: int
    e: int
    c0: int  # elements per fractal row: one 32-byte block
    rows_p: int  # rows padded to 16
    cols_p: int  # cols padded to c0

    @property
    def nd_bytes(self) -> int:
        return self.rows * self.cols * self.e

    @property
    def nz_bytes(self) -> int:
        return self.rows_p * self.cols_p * self.e

    @property
    def block_bytes(self) -> int:
        """One column block: every padded row's c0 elements."""
        return self.rows_p * self.c0 * self.e


def _trans_tiling(g: _Nz, hw: HwConfig) -> tuple[int, int]:
    """(tile rows, a multiple of 16; tile cols, a multiple of c0): four tiles (in and out,
    ping and pong) fill UB; among the shapes that fit, the least estimated time per
    core: tiles per core x (a copy in and a copy out, each as gm_copy_cycles at the
    core's share of HBM). Full-width tiles read one segment; full-height tiles write one."""
    max_elems = (hw.aiv.ub_bytes - UB_RESERVE) // (4 * g.e)
    total = g.batch * g.rows_p * g.cols_p
    # column chunks start on a DMA burst (and on a column block)
    step = math.lcm(g.c0, max(1, hw.dma.burst_bytes // g.e))
    cap = max(16 * step, min(max_elems, cdiv(total, hw.aiv_count)))
    best = None
    for tr in range(16, g.rows_p + 1, 16):
        tc = min(g.cols_p, cap // tr // step * step)
        if tc < g.c0:
            break
        tiles = g.batch * cdiv(g.rows, tr) * cdiv(g.cols, tc)
        active = min(tiles, hw.aiv_count)
        rate = min(hw.aiv.gm_write_bytes_per_cycle, hw.hbm_bytes_per_cycle / active)
        segs_in, segs_out = (1 if tc >= g.cols else tr), (1 if tr >= g.rows_p else cdiv(tc, g.c0))
        tile_bytes = tr * tc * g.e
        per_tile = (gm_copy_cycles(hw, tile_bytes / segs_in, segs_in, rate)
                    + gm_copy_cycles(hw, tile_bytes / segs_out, segs_out, rate))
        cost = cdiv(tiles, hw.aiv_count) * per_tile
        if best is None or cost < best[0]:
            best = (cost, tr, tc)
    return best[1], best[2]


# layout changes keep the values
@register("trans_data", TransDataParams, reference=eltwise(lambda p, a: a, "x"), ins=("x",), outs=("y",))
def lower_trans_data(p: TransDataParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """TransData: convert between ND (row-major) and NZ (fractal) layouts."""
    if p.src_format == p.dst_format:
        raise ProgramError(f"op trans_data: src_format and dst_format are both {p.src_format}: nothing to convert")
    *lead, rows, cols = p.shape
    e = DTYPE_BYTES[p.dtype]
    c0 = UB_BLOCK // e
    g = _Nz(numel(lead) if lead else 1, rows, cols, e, c0, align_up(rows, 16), align_up(cols, c0))
    to_nz = p.dst_format == "NZ"
    x = gm.tensor("x", g.batch * (g.nd_bytes if to_nz else g.nz_bytes))
    y = gm.tensor("y", g.batch * (g.nz_bytes if to_nz else g.nd_bytes))
    nd, nz = (x, y) if to_nz else (y, x)
    tr, tc = _trans_tiling(g, hw)
    buf = Buffers(hw, "trans_data")
    row_ub = align_up(tc * e, UB_BLOCK)
    nd_ub = [buf.alloc(f"nd{i}", Mem.UB, tr * row_ub) for i in (0, 1)]
    nz_ub = [buf.alloc(f"nz{i}", Mem.UB, tr * tc * e) for i in (0, 1)]
    bands, chunks = cdiv(rows, tr), cdiv(cols, tc)

    def tile(b: int, i: int, j: int):
        r_lo, c_lo = i * tr, j * tc
        nr, nc = min(tr, rows - r_lo), min(tc, cols - c_lo)
        nr_p, ncb = align_up(nr, 16), cdiv(nc, c0)
        pitch = align_up(nc * e, UB_BLOCK)
        nd_at = nd.addr + b * g.nd_bytes + (r_lo * cols + c_lo) * e
        nz_at = nz.addr + b * g.nz_bytes + (c_lo // c0) * g.block_bytes + r_lo * c0 * e

        def make(k: int):
            # the rows of ND <-> one run of nr_p x c0 per column block in NZ; V moves the
            # 32-byte blocks between the two orders (a strided vector copy; pad rows zeroed)
            nd_side = (nd_ub[k], nd_at, nc * e, nr, pitch, cols * e)
            nz_side = (nz_ub[k], nz_at, nr_p * c0 * e, ncb, nr_p * c0 * e, g.block_bytes)
            (src_ub, src_gm, seg, nseg, ub_pitch, gm_pitch), (dst_ub, dst_gm, dseg, dnseg, dub_pitch, dgm_pitch) = (
                (nd_side, nz_side) if to_nz else (nz_side, nd_side))
            load = gm_copy(Mem.GM, Mem.UB, src_gm, src_ub, seg, nseg, gm_pitch, ub_pitch)
            work = [VecOp("copy", nr_p * ncb * c0, p.dtype, dst_ub, (src_ub,), flops_per_elem=0)]
            store = gm_copy(Mem.UB, Mem.GM, dst_ub, dst_gm, dseg, dnseg, dub_pitch, dgm_pitch)
            return [load], work, [store]

        return make

    per_core = []
    for lo, hi in split_runs(g.batch * bands * chunks, hw.aiv_count):
        groups: list[list] = []
        band = None
        for t in range(lo, hi):
            b, rest = divmod(t, bands * chunks)
            i, j = divmod(rest, chunks)
            if (b, i) != band:
                groups.append([])
                band = (b, i)
            groups[-1].append(tile(b, i, j))
        per_core.append(groups)
    kernel = pipeline_kernel("trans_data", "trans_data", buf, per_core, [x, y])
    nd_info = TensorInfo("x" if to_nz else "y", p.shape, p.dtype, "ND")
    nz_info = TensorInfo("y" if to_nz else "x", (*lead, g.cols_p // c0, g.rows_p // 16, 16, c0), p.dtype, "NZ")
    ins, outs = ([nd_info], [nz_info]) if to_nz else ([nz_info], [nd_info])
    return Lowered(
        op_type="trans_data", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(ins[0].nbytes + outs[0].nbytes), unit="vector", inputs=ins, outputs=outs,
    )


# ================================================================ embedding


@frozen
class EmbeddingParams:
    tokens: int = param(8, "token ids looked up", validator=_pos)
    vocab: int = param(64000, "rows of the table", validator=_pos)
    hidden: int = param(4096, "elements per row", validator=_pos)
    dtype: str = param("fp16", "table dtype", validator=one_of(("fp16", "bf16", "fp32", "int8")))


def reference_embedding(p: EmbeddingParams, x, specs, ctx) -> dict:
    ids = x["ids"].reshape(p.tokens).astype(np.int64)
    if ids.min() < 0 or ids.max() >= p.vocab:
        raise ValueError(f"embedding: id {ids.max() if ids.max() >= p.vocab else ids.min()} out of range "
                         f"[0, {p.vocab})")
    return {"y": x["table"].reshape(p.vocab, p.hidden)[ids]}


@register("embedding", EmbeddingParams, reference=reference_embedding, ins=("ids", "table"), outs=("y",))
def lower_embedding(p: EmbeddingParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Embedding lookup: gather one [hidden] table row per token id (one DMA per row)."""
    # Token ids are data; we assume distinct ids spread evenly over the vocabulary
    # (row of token t = t * (vocab // tokens)): no two tokens share an L2 line - or,
    # with more tokens than rows, row t mod vocab.
    e = DTYPE_BYTES[p.dtype]
    row = p.hidden * e
    pitch = align_up(row, UB_BLOCK)
    ids = gm.tensor("ids", p.tokens * 4)
    table = gm.tensor("table", p.vocab * row)
    y = gm.tensor("y", p.tokens * row)
    spread = max(1, p.vocab // p.tokens)
    runs = split_runs(p.tokens, hw.aiv_count)
    per_core_tokens = runs[0][1] - runs[0][0]
    buf = Buffers(hw, "embedding")
    ids_ub = buf.alloc("ids", Mem.UB, per_core_tokens * 4)
    tile_rows = (hw.aiv.ub_bytes - UB_RESERVE - align_up(per_core_tokens * 4, UB_BLOCK)) // (2 * pitch)
    if tile_rows < 1:
        raise ProgramError(f"op embedding: one row of hidden={p.hidden} ({row} bytes) twice over does not fit "
                           f"{capacity_text(hw, Mem.UB)}")
    tile_rows = min(tile_rows, per_core_tokens)
    rows_ub = [buf.alloc(f"rows{i}", Mem.UB, tile_rows * pitch) for i in (0, 1)]

    def wraps(t0: int, n: int) -> bool:  # do tokens t0 .. t0 + n - 1 wrap around the table's rows?
        return (t0 * spread) // p.vocab != ((t0 + n - 1) * spread) // p.vocab

    def tile(t0: int, nr: int):
        def make(k: int):
            if nr > 1 and not wraps(t0, nr):  # one run of rows: the loop compress would fold it into
                first = Copy(Mem.GM, Mem.UB, table.addr + t0 * spread % p.vocab * row, rows_ub[k], row)
                gathers = [Loop("r", nr, [first.moved(moving(first.src_addr, "r", spread * row),
                                                      moving(first.dst_addr, "r", pitch))])]
            else:
                gathers = compress([[Copy(Mem.GM, Mem.UB, table.addr + (t0 + i) * spread % p.vocab * row,
                                          rows_ub[k] + i * pitch, row)] for i in range(nr)], "r")
            store = gm_copy(Mem.UB, Mem.GM, rows_ub[k], y.addr + t0 * row, row, nr, pitch, row)
            return gathers, [], [store]
        return make

    per_core, heads, alike = [], [], []
    for lo, hi in runs:
        per_core.append([[tile(t, min(tile_rows, hi - t)) for t in range(lo, hi, tile_rows)]])
        # a core's whole tiles move by tile_rows rows of the table and of y, unless its tokens wrap
        alike.append(0 if wraps(lo, hi - lo) else (hi - lo) // tile_rows)
        # the core's ids, read by the scalar unit to address the gathers
        heads.append([Copy(Mem.GM, Mem.UB, ids.addr + lo * 4, ids_ub, (hi - lo) * 4),
                      SetFlag(Pipe.MTE2, Pipe.S, 0), WaitFlag(Pipe.MTE2, Pipe.S, 0),
                      SetFlag(Pipe.S, Pipe.MTE2, 0), WaitFlag(Pipe.S, Pipe.MTE2, 0)])
    kernel = pipeline_kernel("embedding", "embedding", buf, per_core, [ids, table, y], direct=True,
                              head=lambda c: heads[c], alike=lambda c: alike[c])
    # Inputs list the rows gathered, not the whole table (the roofline counts every
    # listed byte as read).
    ins = [TensorInfo("ids", (p.tokens,), "int32"), TensorInfo("table_rows", (p.tokens, p.hidden), p.dtype)]
    outs = [TensorInfo("y", (p.tokens, p.hidden), p.dtype)]
    return Lowered(
        op_type="embedding", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)),
        unit="vector", inputs=ins, outputs=outs,
    )
