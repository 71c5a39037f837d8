"""Attention: what the kernels share - parameters, the KV-cache reads, the block-table
reads and the operand lists profiling shows."""

from __future__ import annotations

import math

from attrs import frozen, validators

from npusim.errors import ConfigError, ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, Mem, Pipe, set_flag, wait_flag
from npusim.kvcache import KV_LAYOUTS, KvLayout
from npusim.ops.build import cdiv
from npusim.ops.kv_cache import KvCache, kv_row_align_bytes
from npusim.ops.registry import GmArena, TensorInfo, param
from npusim.ops.vector import UB_BLOCK


_pos = validators.gt(0)
_DTYPES = validators.in_(("fp16", "bf16"))
MTE1, MTE2, MTE3, FIX, M, V = Pipe.MTE1, Pipe.MTE2, Pipe.MTE3, Pipe.FIX, Pipe.M, Pipe.V
GM, L1, L0A, L0B, L0C, UB = Mem.GM, Mem.L1, Mem.L0A, Mem.L0B, Mem.L0C, Mem.UB
STAT = 32  # UB bytes of one row's statistic: one 32-byte block (8 fp32), as Brcb lays it out


def _divides_heads(inst, attribute, value) -> None:
    if value > inst.heads or inst.heads % value:
        raise ValueError(f"kv_heads={value} must divide heads={inst.heads}")


def _below_layers(inst, attribute, value) -> None:
    if value >= inst.layers:
        raise ValueError(f"'layer' {value} must be < layers {inst.layers}")


# The KV-cache fields of the readers (as kv_cache_write's layout, layers, layer, block_tokens).
_KV_LAYOUT_HELP = "KV cache layout read: per_layer | contiguous | paged (as kv_cache_write writes it)"
_LAYERS_HELP = "decoder layers the cache holds (the contiguous layout keeps all of them in one tensor)"
_LAYER_HELP = "the layer read (its slice of the contiguous cache)"
_BLOCK_HELP = "tokens per block of the paged layout"


@frozen
class AttentionParams:
    batch: int = param(1, "sequences", validator=_pos)
    heads: int = param(32, "query heads", validator=_pos)
    kv_heads: int = param(32, "K/V heads; fewer than heads is GQA (each serves heads // kv_heads query heads)",
                          validator=[_pos, _divides_heads])
    head_dim: int = param(128, "elements per head", validator=_pos)
    seq_q: int = param(4096, "query length", validator=_pos)
    seq_kv: int = param(4096, "key/value length", validator=_pos)
    causal: bool = param(False, "query i sees only keys <= i + seq_kv - seq_q")
    dtype: str = param("fp16", "dtype of q, k, v and o", validator=_DTYPES)

    def __attrs_post_init__(self):
        if self.causal and self.seq_q > self.seq_kv:
            raise ValueError(f"causal attention needs seq_q ({self.seq_q}) <= seq_kv ({self.seq_kv})")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def visible_pairs(self) -> int:
        """(query, key) pairs the mask lets through, per head."""
        if not self.causal:
            return self.seq_q * self.seq_kv
        off = self.seq_kv - self.seq_q
        return sum(min(self.seq_kv, i + off + 1) for i in range(self.seq_q))


@frozen
class FlashAttentionParams(AttentionParams):
    """AttentionParams plus where K and V come from: a KV cache of seq_kv tokens per sequence."""

    kv_layout: str = param("per_layer", _KV_LAYOUT_HELP, validator=validators.in_(KV_LAYOUTS))
    layers: int = param(1, _LAYERS_HELP, validator=_pos)
    layer: int = param(0, _LAYER_HELP, validator=[validators.ge(0), _below_layers])
    block_tokens: int = param(128, _BLOCK_HELP, validator=_pos)

    def kv_cache(self, row_align_bytes: int | None = None) -> KvLayout:
        """The cache read (one layer's view of it)."""
        return KvLayout(self.kv_layout, self.batch, self.kv_heads, self.seq_kv, self.head_dim, self.dtype,
                        self.layers, self.layer, self.block_tokens, row_align_bytes)


def _io(p: AttentionParams) -> tuple[list[TensorInfo], list[TensorInfo]]:
    qs = (p.batch, p.heads, p.seq_q, p.head_dim)
    ks = (p.batch, p.kv_heads, p.seq_kv, p.head_dim)
    return ([TensorInfo("q", qs, p.dtype), TensorInfo("k", ks, p.dtype), TensorInfo("v", ks, p.dtype)],
            [TensorInfo("o", qs, p.dtype)])


def _kv_inputs(cache: KvCache) -> list[TensorInfo]:
    """The cache bytes an attention kernel must read, as profiling lists them: whole
    per_layer tensors; the layer's slice of the contiguous cache (K and V of every
    token, without the row padding); the tokens of the paged pools and the block
    table. (The roofline counts every listed byte as read.)"""
    p = cache.layout
    tokens = (p.batch, p.kv_heads, p.context, p.head_dim)
    if p.layout == "per_layer":
        return [TensorInfo("k_cache", tokens, p.dtype), TensorInfo("v_cache", tokens, p.dtype)]
    if p.layout == "contiguous":
        return [TensorInfo("kv_cache_layer", (p.batch, p.kv_heads, p.context, 2 * p.head_dim), p.dtype)]
    return [TensorInfo("k_cache_blocks", tokens, p.dtype), TensorInfo("v_cache_blocks", tokens, p.dtype),
            TensorInfo("block_table", (p.batch, cache.max_blocks), "int32")]


def _kv_cache(p, hw: HwConfig, gm: GmArena, op: str) -> KvCache:
    """The KvCache a reader with params p (kv_layout, layers, layer, block_tokens) sees."""
    e = DTYPE_BYTES[p.dtype]
    if p.kv_layout != "per_layer" and (p.head_dim * e) % UB_BLOCK:
        raise ProgramError(f"op {op}: head_dim={p.head_dim} makes a head {p.head_dim * e} bytes, not a multiple "
                           f"of {UB_BLOCK}: the {p.kv_layout} layout's pieces would be misaligned in local memory")
    return KvCache(p.kv_cache(kv_row_align_bytes(hw)), gm)


def _table_read(cache: KvCache, b: int, first: int, last: int, mem: Mem, dst: int) -> list:
    """Paged: the block-table entries first..last of sequence b, read once at the start of
    a block (one small transfer), then handed to the scalar unit, which turns them into
    the addresses of the block loads before MTE2 may issue them.
    # assumption: the scalar unit's table lookups cost the transfer and the hand-off only"""
    n = last - first + 1
    return [Copy(GM, mem, cache.table_addr(b, first), dst, n * 4),
            set_flag(MTE2, Pipe.S, 0), wait_flag(MTE2, Pipe.S, 0), set_flag(Pipe.S, MTE2, 0),
            wait_flag(Pipe.S, MTE2, 0)]


# The most block loads (a segment of K or of V per paged block a tile or key step
# touches; paged reads are unrolled, one instruction each) a paged reader may issue:
# decode of 8 sequences x 32 KV heads x 4096 tokens in blocks of one token is 2^21,
# about a minute and 2 GB to simulate; past it, minutes and gigabytes more.
PAGE_LOADS_MAX = 1 << 21


def page_loads(keys: int, step: int, block_tokens: int) -> int:
    """Paged segments of one read of keys 0..keys-1 of K (or V) in steps of `step` keys:
    every block once, and once more for each step boundary that falls inside a block."""
    inner = cdiv(keys, step) - 1  # boundaries at step, 2 step, ...
    return cdiv(keys, block_tokens) + inner - inner // (math.lcm(step, block_tokens) // step)


def check_page_loads(op: str, shape: str, loads: int, block_tokens: int) -> None:
    """Refuse, in one line, a paged read of more than PAGE_LOADS_MAX block loads, before
    its programs are built (the unrolled loads alone take minutes and gigabytes)."""
    if loads > PAGE_LOADS_MAX:
        raise ConfigError(f"op {op}: {shape} read in blocks of block_tokens={block_tokens} is {loads} block loads "
                          f"of K and V, more than the {PAGE_LOADS_MAX} (2^21) npusim simulates (about a minute)")


def _table_bytes(p, context: int) -> int:
    """Local bytes for a whole sequence's block-table entries (paged; 0 otherwise)."""
    return cdiv(context, p.block_tokens) * 4 if p.kv_layout == "paged" else 0
