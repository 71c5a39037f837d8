"""Layout operators on the vector cores (AIV): trans_data, kv_cache_write, embedding.

These move data rather than compute on it, so what they cost is their DMA pattern:
how many segments, how long, how aligned. Each is a custom tile pipeline
(`vector_kernels.tile_pipeline`): per core a list of tiles, each loaded by MTE2,
rearranged in UB by V where the layout needs it, and stored by MTE3, double
buffered; runs of tiles that move by constant steps become loops.

- trans_data ND <-> NZ: NZ keeps a [rows, cols] matrix as column blocks of c0
  elements (16 for fp16: 16 x 16 fractals), each block holding every (padded) row
  contiguously - the cube's operand layout. A tile of ND rows becomes one
  segment per column block on the NZ side, strided by a whole column block.
- kv_cache_write: one layer's new K and V tokens into a KV cache laid out
  per_layer, contiguous or paged (`KvCache` says where every token goes), so the
  three layouts differ in segments, alignment and the block-table reads.
- embedding: a gather, one DMA per token row.
"""

from __future__ import annotations

import math

from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, GmTensor, Mem, Pipe, SetFlag, VecOp, WaitFlag
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import UB_BLOCK, numel, one_of, shape_validator
from npusim.ops.vector_kernels import (
    compress, pipeline_epilogue, pipeline_prologue, tile_kernel, tile_pipeline,
)

_pos = validators.gt(0)
# UB kept free of tile buffers for alignment padding and small per-core tables.
_UB_RESERVE = 1024


def gm_copy(src: Mem, dst: Mem, src_addr, dst_addr, nbytes: int, segments: int = 1,
            src_stride: int | None = None, dst_stride: int | None = None) -> Copy:
    """A Copy of `segments` pieces; pieces back to back on both sides are one segment
    (one DMA burst train, as the hardware would issue it)."""
    ss = nbytes if src_stride is None else src_stride
    ds = nbytes if dst_stride is None else dst_stride
    if segments == 1 or (ss == nbytes and ds == nbytes):
        return Copy(src, dst, src_addr, dst_addr, nbytes * segments)
    return Copy(src, dst, src_addr, dst_addr, nbytes, segments, ss, ds)


def _split_runs(units: int, cores: int) -> list[tuple[int, int]]:
    """Contiguous (first, end) runs of units, one per core, as even as whole units allow."""
    per = cdiv(units, cores)
    return [(s, min(units, s + per)) for s in range(0, units, per)]


def _pipeline_kernel(name: str, op: str, buf: Buffers, per_core: list[list], gm: list[GmTensor],
                     direct: bool = False, head=lambda core: [], ) -> object:
    """Kernel from per-core lists of tile groups (each group a list of tile fns whose
    tiles move by constant steps); head(core) -> instructions before the pipeline."""
    bodies = []
    for core, groups in enumerate(per_core):
        body = head(core) + pipeline_prologue(direct)
        body += compress([tile_pipeline(g, direct) for g in groups], "i")
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
    core: tiles per core x (two DMA start-ups + a start-up per segment + bytes at the
    core's share of HBM). Full-width tiles read one segment; full-height tiles write one."""
    max_elems = (hw.aiv.ub_bytes - _UB_RESERVE) // (4 * g.e)
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
        segs = (1 if tc >= g.cols else tr) + (1 if tr >= g.rows_p else cdiv(tc, g.c0))
        per_tile = 2 * hw.dma.startup_cycles + segs * hw.dma.segment_cycles + 2 * tr * tc * g.e / rate
        cost = cdiv(tiles, hw.aiv_count) * per_tile
        if best is None or cost < best[0]:
            best = (cost, tr, tc)
    return best[1], best[2]


@register("trans_data", TransDataParams)
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
    for lo, hi in _split_runs(g.batch * bands * chunks, hw.aiv_count):
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
    kernel = _pipeline_kernel("trans_data", "trans_data", buf, per_core, [x, y])
    nd_info = TensorInfo("x" if to_nz else "y", p.shape, p.dtype, "ND")
    nz_info = TensorInfo("y" if to_nz else "x", (*lead, g.cols_p // c0, g.rows_p // 16, 16, c0), p.dtype, "NZ")
    ins, outs = ([nd_info], [nz_info]) if to_nz else ([nz_info], [nd_info])
    return Lowered(
        op_type="trans_data", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(ins[0].nbytes + outs[0].nbytes), unit="vector", inputs=ins, outputs=outs,
    )


# ================================================================ kv_cache_write

KV_LAYOUTS = ("per_layer", "contiguous", "paged")
# GM names of a cache's tensors per layout: the same for the writer (kv_cache_write)
# and the readers (KV_READERS), so a graph binds both to the same tensors
KV_CACHE_NAMES = {"per_layer": ("k_cache", "v_cache"), "contiguous": ("kv_cache",),
                  "paged": ("k_cache", "v_cache", "block_table")}
KV_READERS = ("decode_attention", "flash_attention")


@frozen
class KvCacheWriteParams:
    batch: int = param(8, "sequences", validator=_pos)
    kv_heads: int = param(32, "KV heads", validator=_pos)
    head_dim: int = param(128, "elements per head", validator=_pos)
    new_tokens: int = param(1, "tokens written per sequence (1 in decode, the prompt in prefill)", validator=_pos)
    context: int = param(4096, "cache capacity in tokens per sequence", validator=_pos)
    layers: int = param(32, "decoder layers (the contiguous cache holds all of them)", validator=_pos)
    layer: int = param(0, "the layer written", validator=validators.ge(0))
    position: int = param(-1, "first position written; -1: context - new_tokens (the cache ends full)",
                          validator=validators.ge(-1))
    layout: str = param("per_layer", "per_layer | contiguous | paged", validator=one_of(KV_LAYOUTS))
    block_tokens: int = param(128, "tokens per block of the paged layout", validator=_pos)
    dtype: str = param("fp16", "cache dtype", validator=one_of(("fp16", "bf16", "fp32", "int8")))

    def __attrs_post_init__(self):
        if self.layer >= self.layers:
            raise ValueError(f"'layer' {self.layer} must be < layers {self.layers}")
        if self.start + self.new_tokens > self.context:
            raise ValueError(f"'position' {self.start} + new_tokens {self.new_tokens} exceeds context {self.context}")

    @property
    def start(self) -> int:
        return self.context - self.new_tokens if self.position < 0 else self.position


def scatter_step(num_blocks: int) -> int:
    """The stride of the paged layout's block permutation: logical block i (counted over
    every sequence) lives in physical block i * step mod num_blocks. The step is coprime
    with num_blocks (so it is a permutation) and about half of it (so neighbours land
    far apart)."""
    return next(m for m in range(num_blocks // 2 + 1, 2 * num_blocks + 2) if math.gcd(m, num_blocks) == 1)


def physical_block(b: int, logical: int, max_blocks: int, num_blocks: int) -> int:
    """Physical block holding logical block `logical` of sequence b in the paged layout
    (what the block table says; the kernels and the executor's starting cache agree)."""
    return (b * max_blocks + logical) * scatter_step(num_blocks) % num_blocks


def kv_row_bytes(head_dim: int, dtype: str, hw: HwConfig) -> int:
    """Bytes of one token's row of the contiguous layout: its K and V, padded to the DMA burst."""
    return align_up(2 * head_dim * DTYPE_BYTES[dtype], hw.dma.burst_bytes)


class KvCache:
    """Where each token of a KV cache lives, per layout (GM addresses of K and V rows).

    per_layer:  per layer a K and a V tensor [batch, kv_heads, context, head_dim], each
                its own allocation (what a framework's list of per-layer caches is).
    contiguous: one tensor [batch, layers, kv_heads, context, row] for all layers, a
                token's K and V side by side in one row padded to the DMA burst
                (row = align_up(2 * head_dim * e, burst)): one aligned segment per
                token and head carries both.
    paged:      K and V pools [num_blocks, kv_heads, block_tokens, head_dim] and a
                block table [batch, blocks per sequence] (int32) mapping each
                sequence's logical blocks to physical ones; blocks are handed out in a
                scattered order (a fixed permutation), as after a serving run's churn.
    """

    def __init__(self, p: KvCacheWriteParams, hw: HwConfig, gm: GmArena):
        self.p, self.e = p, DTYPE_BYTES[p.dtype]
        e, b, h, s, d = self.e, p.batch, p.kv_heads, p.context, p.head_dim
        self.tensors: list[GmTensor] = []
        if p.layout == "per_layer":
            self.k = gm.tensor("k_cache", b * h * s * d * e)
            self.v = gm.tensor("v_cache", b * h * s * d * e)
            self.tensors = [self.k, self.v]
        elif p.layout == "contiguous":
            self.row = kv_row_bytes(d, p.dtype, hw)
            self.kv = gm.tensor("kv_cache", b * p.layers * h * s * self.row)
            self.tensors = [self.kv]
        else:
            self.max_blocks = cdiv(s, p.block_tokens)
            self.num_blocks = b * self.max_blocks
            self.k = gm.tensor("k_cache", self.num_blocks * h * p.block_tokens * d * e)
            self.v = gm.tensor("v_cache", self.num_blocks * h * p.block_tokens * d * e)
            self.table = gm.tensor("block_table", b * self.max_blocks * 4)
            self.tensors = [self.k, self.v, self.table]

    @classmethod
    def of(cls, hw: HwConfig, gm: GmArena, *, batch: int, kv_heads: int, head_dim: int, context: int, dtype: str,
           layout: str, layers: int, layer: int, block_tokens: int) -> KvCache:
        """The cache an attention kernel reads: the same tensors (names, sizes) and
        addresses kv_cache_write uses for this description."""
        p = KvCacheWriteParams(batch=batch, kv_heads=kv_heads, head_dim=head_dim, new_tokens=1, context=context,
                               layers=layers, layer=layer, layout=layout, block_tokens=block_tokens, dtype=dtype)
        return cls(p, hw, gm)

    def physical_block(self, b: int, logical: int) -> int:
        return physical_block(b, logical, self.max_blocks, self.num_blocks)

    def token_pitch(self) -> int:
        """Bytes from one token of a head to the next inside a run (a block, when paged)."""
        return self.row if self.p.layout == "contiguous" else self.p.head_dim * self.e

    def runs(self, which: str, b: int, h: int, pos: int, n: int) -> list[tuple[int, int]]:
        """Tokens pos .. pos+n-1 of sequence b, head h as (GM address, tokens) runs, each
        contiguous in GM (token_pitch apart): one run, or one per paged block touched,
        in the order of the tokens (the blocks' physical order is scattered)."""
        if self.p.layout != "paged":
            return [(self.token_addr(which, b, h, pos), n)]
        out, bt = [], self.p.block_tokens
        while n > 0:
            take = min(n, bt - pos % bt)
            out.append((self.token_addr(which, b, h, pos), take))
            pos, n = pos + take, n - take
        return out

    def head_stride(self) -> int:
        """Bytes from one head's run of tokens to the next head's."""
        p = self.p
        if p.layout == "per_layer":
            return p.context * p.head_dim * self.e
        if p.layout == "contiguous":
            return p.context * self.row
        return p.block_tokens * p.head_dim * self.e

    def token_addr(self, which: str, b: int, h: int, pos: int) -> int:
        """GM address of K ('k') or V ('v') of sequence b, head h, position pos."""
        p, e = self.p, self.e
        if p.layout == "per_layer":
            t = self.k if which == "k" else self.v
            return t.addr + ((b * p.kv_heads + h) * p.context + pos) * p.head_dim * e
        if p.layout == "contiguous":
            row = ((b * p.layers + p.layer) * p.kv_heads + h) * p.context + pos
            return self.kv.addr + row * self.row + (p.head_dim * e if which == "v" else 0)
        t = self.k if which == "k" else self.v
        blk, off = divmod(pos, p.block_tokens)
        return t.addr + ((self.physical_block(b, blk) * p.kv_heads + h) * p.block_tokens + off) * p.head_dim * e


def _kv_tiling(p: KvCacheWriteParams, hw: HwConfig, row_bytes: int) -> tuple[int, int]:
    """(tokens, heads) per tile, the same for every layout: the UB of the contiguous
    layout (K and V tiles in, a [heads, tokens, row] tile out, ping and pong) must
    fit; least estimated time per core (as _trans_tiling)."""
    e, d, h = DTYPE_BYTES[p.dtype], p.head_dim, p.kv_heads
    budget = hw.aiv.ub_bytes - _UB_RESERVE - 2048  # block-table slices
    n = p.new_tokens
    best = None
    tcs = sorted({min(n, 1 << i) for i in range(n.bit_length() + 1)} | {n})
    for hg in range(1, h + 1):
        for tc in tcs:
            if 2 * (2 * tc * hg * d * e + tc * hg * row_bytes) > budget:
                continue
            tiles = p.batch * cdiv(n, tc) * cdiv(h, hg)
            active = min(tiles, hw.aiv_count)
            rate = min(hw.aiv.gm_write_bytes_per_cycle, hw.hbm_bytes_per_cycle / active)
            segs = 2 * (1 if hg == h else tc) + 2 * hg
            per_tile = 4 * hw.dma.startup_cycles + segs * hw.dma.segment_cycles + 4 * tc * hg * d * e / rate
            cost = cdiv(tiles, hw.aiv_count) * per_tile
            if best is None or cost < best[0]:
                best = (cost, tc, hg)
    if best is None:
        raise ProgramError(f"op kv_cache_write: one token of one head (head_dim={d}) does not fit UB "
                           f"({hw.aiv.ub_bytes} bytes)")
    return best[1], best[2]


@register("kv_cache_write", KvCacheWriteParams)
def lower_kv_cache_write(p: KvCacheWriteParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Write one layer's new K and V tokens into the KV cache (per_layer, contiguous or paged)."""
    e, d, nh, n = DTYPE_BYTES[p.dtype], p.head_dim, p.kv_heads, p.new_tokens
    if (d * e) % UB_BLOCK:
        raise ProgramError(f"op kv_cache_write: head_dim={d} makes a head {d * e} bytes, not a multiple of "
                           f"{UB_BLOCK} (UB operand alignment)")
    # New K and V as the QKV projection (and RoPE) leave them: [batch, new_tokens, kv_heads, head_dim].
    k_new = gm.tensor("k", p.batch * n * nh * d * e)
    v_new = gm.tensor("v", p.batch * n * nh * d * e)
    cache = KvCache(p, hw, gm)
    row = cache.row if p.layout == "contiguous" else d * e  # bytes a token of one head takes in the cache
    tc, hg = _kv_tiling(p, hw, align_up(2 * d * e, hw.dma.burst_bytes))
    buf = Buffers(hw, "kv_cache_write")
    in_k = [buf.alloc(f"k{i}", Mem.UB, tc * hg * d * e) for i in (0, 1)]
    in_v = [buf.alloc(f"v{i}", Mem.UB, tc * hg * d * e) for i in (0, 1)]
    if p.layout == "contiguous":
        out = [buf.alloc(f"kv{i}", Mem.UB, hg * tc * row) for i in (0, 1)]
    elif tc > 1 and hg > 1:
        out_k = [buf.alloc(f"k_t{i}", Mem.UB, hg * tc * d * e) for i in (0, 1)]
        out_v = [buf.alloc(f"v_t{i}", Mem.UB, hg * tc * d * e) for i in (0, 1)]
    paged = p.layout == "paged"

    # Token runs per sequence: chunks of tc, never straddling a paged block.
    start = p.start
    runs = []
    t = 0
    while t < n:
        end = min(n, t + tc)
        if paged:
            end = min(end, (start + t) // p.block_tokens * p.block_tokens + p.block_tokens - start)
        runs.append((t, end - t))
        t = end
    groups = cdiv(nh, hg)
    units = [(b, t0, tn, g * hg, min(hg, nh - g * hg)) for b in range(p.batch) for t0, tn in runs
             for g in range(groups)]

    def tile(b: int, t0: int, tn: int, h0: int, hn: int):
        pos = start + t0
        src_off = ((b * n + t0) * nh + h0) * d * e

        def make(k: int):
            loads = [gm_copy(Mem.GM, Mem.UB, t.addr + src_off, ub[k], hn * d * e, tn, nh * d * e, hn * d * e)
                     for t, ub in ((k_new, in_k), (v_new, in_v))]
            if p.layout == "contiguous":
                # V interleaves K and V per token: [tokens, heads, d] x 2 -> [heads, tokens, row]
                work = [VecOp("copy", tn * hn * d, p.dtype, out[k], (in_k[k],), flops_per_elem=0),
                        VecOp("copy", tn * hn * d, p.dtype, out[k] + d * e, (in_v[k],), flops_per_elem=0)]
                stores = [gm_copy(Mem.UB, Mem.GM, out[k], cache.token_addr("k", b, h0, pos), tn * row, hn,
                                  tn * row, cache.head_stride())]
                return loads, work, stores
            if tn > 1 and hn > 1:  # token-major tile -> head-major runs
                work = [VecOp("copy", tn * hn * d, p.dtype, o[k], (i[k],), flops_per_elem=0)
                        for o, i in ((out_k, in_k), (out_v, in_v))]
                src = (out_k[k], out_v[k])
            else:  # [1, heads, d] or [tokens, 1, d]: already one run per head
                work, src = [], (in_k[k], in_v[k])
            stores = [gm_copy(Mem.UB, Mem.GM, ub, cache.token_addr(which, b, h0, pos), tn * d * e, hn,
                              tn * d * e, cache.head_stride()) for which, ub in zip("kv", src)]
            return loads, work, stores

        return make

    direct = p.layout != "contiguous" and not (tc > 1 and hg > 1)
    if paged:  # each core reads the block-table entries of its sequences once
        table_ub = buf.alloc("block_table", Mem.UB, 2048)
    per_core, heads = [], []
    for lo, hi in _split_runs(len(units), hw.aiv_count):
        mine = units[lo:hi]
        groups: list[list] = []
        key = None
        for u in mine:  # a group: the tiles of one sequence and token run (they move by hg heads)
            if (u[0], u[1]) != key:
                groups.append([])
                key = (u[0], u[1])
            groups[-1].append(tile(*u))
        per_core.append(groups)
        if paged:
            reads, at = [], table_ub
            for b in sorted({u[0] for u in mine}):
                blks = [(start + u[1]) // p.block_tokens for u in mine if u[0] == b]
                lo_b, hi_b = min(blks), max(blks)
                nbytes = (hi_b - lo_b + 1) * 4
                reads.append(Copy(Mem.GM, Mem.UB, cache.table.addr + (b * cache.max_blocks + lo_b) * 4, at, nbytes))
                at += align_up(nbytes, UB_BLOCK)
            if at > table_ub + 2048:
                raise ProgramError(f"op kv_cache_write: block-table slice needs {at - table_ub} bytes of UB, "
                                   "2048 reserved")
            # the scalar unit turns the entries into store addresses before MTE3 may write
            heads.append(reads + [SetFlag(Pipe.MTE2, Pipe.S, 0), WaitFlag(Pipe.MTE2, Pipe.S, 0),
                                  SetFlag(Pipe.S, Pipe.MTE3, 0), WaitFlag(Pipe.S, Pipe.MTE3, 0)])
    kernel = _pipeline_kernel("kv_cache_write", "kv_cache_write", buf, per_core, [k_new, v_new, *cache.tensors],
                              direct, head=(lambda c: heads[c]) if paged else (lambda c: []))
    new = (p.batch, n, nh, d)
    slots = (p.batch, nh, n, d)
    ins = [TensorInfo("k", new, p.dtype), TensorInfo("v", new, p.dtype)]
    if paged:  # the table entries this write reads
        ins.append(TensorInfo("block_table", (p.batch, len({(start + t0) // p.block_tokens for t0, _ in runs})),
                              "int32"))
    # The outputs are the cache slots written (not the whole cache: the roofline counts
    # every listed byte as moved).
    outs = [TensorInfo("k_cache_slots", slots, p.dtype), TensorInfo("v_cache_slots", slots, p.dtype)]
    return Lowered(
        op_type="kv_cache_write", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)),
        unit="vector", inputs=ins, outputs=outs,
    )


# ================================================================ embedding


@frozen
class EmbeddingParams:
    tokens: int = param(8, "token ids looked up", validator=_pos)
    vocab: int = param(64000, "rows of the table", validator=_pos)
    hidden: int = param(4096, "elements per row", validator=_pos)
    dtype: str = param("fp16", "table dtype", validator=one_of(("fp16", "bf16", "fp32", "int8")))


@register("embedding", EmbeddingParams)
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
    runs = _split_runs(p.tokens, hw.aiv_count)
    per_core_tokens = runs[0][1] - runs[0][0]
    buf = Buffers(hw, "embedding")
    ids_ub = buf.alloc("ids", Mem.UB, per_core_tokens * 4)
    tile_rows = (hw.aiv.ub_bytes - _UB_RESERVE - align_up(per_core_tokens * 4, UB_BLOCK)) // (2 * pitch)
    if tile_rows < 1:
        raise ProgramError(f"op embedding: one row of hidden={p.hidden} ({row} bytes) twice over does not fit UB "
                           f"({hw.aiv.ub_bytes} bytes)")
    tile_rows = min(tile_rows, per_core_tokens)
    rows_ub = [buf.alloc(f"rows{i}", Mem.UB, tile_rows * pitch) for i in (0, 1)]

    def tile(t0: int, nr: int):
        def make(k: int):
            gathers = compress([[Copy(Mem.GM, Mem.UB, table.addr + (t0 + i) * spread % p.vocab * row,
                                      rows_ub[k] + i * pitch, row)] for i in range(nr)], "r")
            store = gm_copy(Mem.UB, Mem.GM, rows_ub[k], y.addr + t0 * row, row, nr, pitch, row)
            return gathers, [], [store]
        return make

    per_core, heads = [], []
    for lo, hi in runs:
        per_core.append([[tile(t, min(tile_rows, hi - t)) for t in range(lo, hi, tile_rows)]])
        # the core's ids, read by the scalar unit to address the gathers
        heads.append([Copy(Mem.GM, Mem.UB, ids.addr + lo * 4, ids_ub, (hi - lo) * 4),
                      SetFlag(Pipe.MTE2, Pipe.S, 0), WaitFlag(Pipe.MTE2, Pipe.S, 0),
                      SetFlag(Pipe.S, Pipe.MTE2, 0), WaitFlag(Pipe.S, Pipe.MTE2, 0)])
    kernel = _pipeline_kernel("embedding", "embedding", buf, per_core, [ids, table, y], direct=True,
                              head=lambda c: heads[c])
    # Inputs list the rows gathered, not the whole table (the roofline counts every
    # listed byte as read).
    ins = [TensorInfo("ids", (p.tokens,), "int32"), TensorInfo("table_rows", (p.tokens, p.hidden), p.dtype)]
    outs = [TensorInfo("y", (p.tokens, p.hidden), p.dtype)]
    return Lowered(
        op_type="embedding", params=p, tiling=None, kernels=[kernel], flops=0.0,
        min_gm_bytes=float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs)),
        unit="vector", inputs=ins, outputs=outs,
    )
