"""kv_cache_write: one layer's new K and V tokens into a KV cache laid out per_layer,
contiguous or paged (npusim.kvcache.KvLayout says where every token goes, KvCache
binds it to GM), so the three layouts differ in segments, alignment and the
block-table reads. A custom tile pipeline on the vector cores, as the layout ops
(npusim.ops.layout)."""

from __future__ import annotations

from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, GmTensor, Mem, Pipe, SetFlag, VecOp, WaitFlag
from npusim.kvcache import KV_LAYOUTS, KvLayout, row_bytes
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv, gm_copy_cycles
from npusim.ops.layout import UB_RESERVE, gm_copy, pipeline_kernel, split_runs
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import UB_BLOCK, one_of

_pos = validators.gt(0)


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
        if self.new_tokens > self.context:  # (position -1 would start before the cache: a negative address)
            raise ValueError(f"'new_tokens' {self.new_tokens} exceeds context {self.context} (the tokens the cache "
                             "holds per sequence)")
        if self.start + self.new_tokens > self.context:
            raise ValueError(f"'position' {self.start} + new_tokens {self.new_tokens} exceeds context {self.context}")

    @property
    def start(self) -> int:
        return self.context - self.new_tokens if self.position < 0 else self.position

    def kv_cache(self, row_align_bytes: int | None = None) -> KvLayout:
        """The cache written (one layer's view of it)."""
        return KvLayout(self.layout, self.batch, self.kv_heads, self.context, self.head_dim, self.dtype, self.layers,
                        self.layer, self.block_tokens, row_align_bytes)


def kv_row_bytes(head_dim: int, dtype: str, hw: HwConfig) -> int:
    """Bytes of one token's row of the contiguous layout: its K and V, padded to the DMA burst."""
    return row_bytes(head_dim, dtype, kv_row_align_bytes(hw))


def kv_row_align_bytes(hw: HwConfig) -> int:
    """What a contiguous cache row is padded to: one DMA burst (the 64-byte rule)."""
    return hw.dma.burst_bytes


class KvCache:
    """A KV cache's layout (npusim.kvcache.KvLayout) bound to GM tensors: the
    addresses of every token's K and V rows, as the writer and readers use them."""

    def __init__(self, layout: KvLayout, gm: GmArena):
        self.layout = layout
        self.named = {name: gm.tensor(name, nbytes) for name, nbytes in layout.tensor_bytes().items()}
        self.tensors: list[GmTensor] = list(self.named.values())
        self.table = self.named.get("block_table")

    @classmethod
    def of(cls, hw: HwConfig, gm: GmArena, *, batch: int, kv_heads: int, head_dim: int, context: int, dtype: str,
           layout: str, layers: int, layer: int, block_tokens: int) -> KvCache:
        """The cache of this description on `hw` (the contiguous row padded to its DMA burst)."""
        return cls(KvLayout(layout, batch, kv_heads, context, head_dim, dtype, layers, layer, block_tokens,
                            kv_row_align_bytes(hw)), gm)

    @property
    def max_blocks(self) -> int:
        return self.layout.max_blocks

    @property
    def row(self) -> int:
        return self.layout.row_bytes

    def physical_block(self, b: int, logical: int) -> int:
        return self.layout.physical_block(b, logical)

    def token_pitch(self) -> int:
        return self.layout.token_pitch()

    def head_stride(self) -> int:
        return self.layout.head_stride()

    def table_addr(self, b: int, first: int) -> int:
        """Paged: GM address of block-table entry `first` of sequence b (int32 entries)."""
        return self.table.addr + (b * self.max_blocks + first) * 4

    def token_addr(self, which: str, b: int, h: int, pos: int) -> int:
        """GM address of K ('k') or V ('v') of sequence b, head h, position pos."""
        name, off = self.layout.token_offset(which, b, h, pos)
        return self.named[name].addr + off

    def runs(self, which: str, b: int, h: int, pos: int, n: int) -> list[tuple[int, int]]:
        """Tokens pos .. pos+n-1 of sequence b, head h as (GM address, tokens) runs, each
        contiguous in GM (token_pitch apart): one run, or one per paged block touched,
        in the order of the tokens (the blocks' physical order is scattered)."""
        return [(self.token_addr(which, b, h, at), k) for at, k in self.layout.runs(b, pos, n)]


def _kv_tiling(p: KvCacheWriteParams, hw: HwConfig, row_bytes: int) -> tuple[int, int]:
    """(tokens, heads) per tile, the same for every layout: the UB of the contiguous
    layout (K and V tiles in, a [heads, tokens, row] tile out, ping and pong) must
    fit; least estimated time per core (as _trans_tiling)."""
    e, d, h = DTYPE_BYTES[p.dtype], p.head_dim, p.kv_heads
    reserved = UB_RESERVE + 2048  # and block-table slices
    budget = hw.aiv.ub_bytes - reserved
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
            segs_in, tile_bytes = (1 if hg == h else tc), tc * hg * d * e  # k and v: read, then written per head
            per_tile = 2 * (gm_copy_cycles(hw, tile_bytes / segs_in, segs_in, rate)
                            + gm_copy_cycles(hw, tile_bytes / hg, hg, rate))
            cost = cdiv(tiles, hw.aiv_count) * per_tile
            if best is None or cost < best[0]:
                best = (cost, tc, hg)
    if best is None:  # the least tile, one token of one head, does not fit (kv_heads sets no part of it)
        raise ProgramError(f"op kv_cache_write: one token of one head of head_dim={d} in dtype={p.dtype} (its K and "
                           f"V in and their row out, twice over: {2 * (2 * d * e + row_bytes)} bytes, and {reserved} "
                           f"reserved) does not fit {capacity_text(hw, Mem.UB)}")
    return best[1], best[2]


def reference_kv_cache_write(p: KvCacheWriteParams, x, specs, ctx) -> dict:
    """New K and V ([batch, new_tokens, kv_heads, head_dim]) into the layer's logical
    cache, packed back into the layout's tensors (the block table passes through):
    sequence b's new tokens end at its own length (ctx.lengths) when position is -1,
    start at `position` otherwise."""
    cache = p.kv_cache()
    logical = []
    for which, old in zip("kv", cache.unpack(x)):
        new = x[which].reshape(p.batch, p.new_tokens, p.kv_heads, p.head_dim)
        old = old.copy()
        for b in range(p.batch):
            start = ctx.lengths[b] - p.new_tokens if p.position < 0 else p.position
            keep = min(p.new_tokens, p.context - start)
            old[b, :, start:start + keep] = new[b, :keep].transpose(1, 0, 2)
        logical.append(old)
    out = cache.pack(x, *logical)
    return out | ({"block_table": x["block_table"]} if "block_table" in x else {})


@register("kv_cache_write", KvCacheWriteParams, reference=reference_kv_cache_write, ins=("k", "v"), outs=(),
          kv="write")
def lower_kv_cache_write(p: KvCacheWriteParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Write one layer's new K and V tokens into the KV cache (per_layer, contiguous or paged)."""
    e, d, nh, n = DTYPE_BYTES[p.dtype], p.head_dim, p.kv_heads, p.new_tokens
    if (d * e) % UB_BLOCK:
        raise ProgramError(f"op kv_cache_write: head_dim={d} makes a head {d * e} bytes, not a multiple of "
                           f"{UB_BLOCK} (UB operand alignment)")
    # New K and V as the QKV projection (and RoPE) leave them: [batch, new_tokens, kv_heads, head_dim].
    k_new = gm.tensor("k", p.batch * n * nh * d * e)
    v_new = gm.tensor("v", p.batch * n * nh * d * e)
    cache = KvCache(p.kv_cache(kv_row_align_bytes(hw)), gm)
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
    head_groups = cdiv(nh, hg)
    units = [(b, t0, tn, g * hg, min(hg, nh - g * hg)) for b in range(p.batch) for t0, tn in runs
             for g in range(head_groups)]

    def form(tn: int, hn: int, k: int) -> tuple[list, list, list]:
        """(loads, work, stores) of a tile of tn tokens x hn heads on buffer set k, its GM
        addresses 0: a tile of that size is these, its loads and stores moved to its GM."""
        loads = [gm_copy(Mem.GM, Mem.UB, 0, ub[k], hn * d * e, tn, nh * d * e, hn * d * e) for ub in (in_k, in_v)]
        if p.layout == "contiguous":
            # V interleaves K and V per token: [tokens, heads, d] x 2 -> [heads, tokens, row]
            moves = ((tn, row, hn * d * e), (hn, tn * row, d * e))  # token t, head h: a row of d
            work = [VecOp("copy", tn * hn * d, p.dtype, out[k], (in_k[k],), flops_per_elem=0, pitches=moves),
                    VecOp("copy", tn * hn * d, p.dtype, out[k] + d * e, (in_v[k],), flops_per_elem=0,
                          pitches=moves)]
            return loads, work, [gm_copy(Mem.UB, Mem.GM, out[k], 0, tn * row, hn, tn * row, cache.head_stride())]
        if tn > 1 and hn > 1:  # token-major tile -> head-major runs
            moves = ((tn, d * e, hn * d * e), (hn, tn * d * e, d * e))  # [tokens, heads, d] -> [heads, tokens, d]
            work = [VecOp("copy", tn * hn * d, p.dtype, o[k], (i[k],), flops_per_elem=0, pitches=moves)
                    for o, i in ((out_k, in_k), (out_v, in_v))]
            src = (out_k[k], out_v[k])
        else:  # [1, heads, d] or [tokens, 1, d]: already one run per head
            work, src = [], (in_k[k], in_v[k])
        return loads, work, [gm_copy(Mem.UB, Mem.GM, ub, 0, tn * d * e, hn, tn * d * e, cache.head_stride())
                             for ub in src]

    forms: dict[tuple[int, int, int], tuple[list, list, list]] = {}  # (tn, hn, k) -> form(tn, hn, k)
    stored = "k" if p.layout == "contiguous" else "kv"  # the cache whose address each store takes

    def tile(b: int, t0: int, tn: int, h0: int, hn: int):
        pos = start + t0
        src_off = ((b * n + t0) * nh + h0) * d * e

        def make(k: int):
            key = (tn, hn, k)
            if key not in forms:
                forms[key] = form(tn, hn, k)
            loads, work, stores = forms[key]
            return ([c.moved(t.addr + src_off, c.dst_addr) for c, t in zip(loads, (k_new, v_new))], work,
                    [c.moved(c.src_addr, cache.token_addr(which, b, h0, pos)) for c, which in zip(stores, stored)])

        return make

    direct = p.layout != "contiguous" and not (tc > 1 and hg > 1)
    if paged:  # each core reads the block-table entries of its sequences once
        table_ub = buf.alloc("block_table", Mem.UB, 2048)
    per_core, heads = [], []
    for lo, hi in split_runs(len(units), hw.aiv_count):
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
                reads.append(Copy(Mem.GM, Mem.UB, cache.table_addr(b, lo_b), at, nbytes))
                at += align_up(nbytes, UB_BLOCK)
            if at > table_ub + 2048:
                raise ProgramError(f"op kv_cache_write: block-table slice needs {at - table_ub} bytes of UB, "
                                   "2048 reserved")
            # the scalar unit turns the entries into store addresses before MTE3 may write
            heads.append(reads + [SetFlag(Pipe.MTE2, Pipe.S, 0), WaitFlag(Pipe.MTE2, Pipe.S, 0),
                                  SetFlag(Pipe.S, Pipe.MTE3, 0), WaitFlag(Pipe.S, Pipe.MTE3, 0)])
    # a group's tiles move by hg heads: whole runs of them are alike (tile_pipeline builds a few)
    # when every head group is full (a short last one is a different tile)
    alike = head_groups if nh % hg == 0 else 0
    kernel = pipeline_kernel("kv_cache_write", "kv_cache_write", buf, per_core, [k_new, v_new, *cache.tensors],
                              direct, head=(lambda c: heads[c]) if paged else (lambda c: []),
                              alike=lambda c: alike)
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
