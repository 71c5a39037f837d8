"""Attention: FlashAttention as one MIX kernel, flash-decoding on the vector cores,
and the unfused 5-kernel chain it replaces.

Tensors are BNSD: q [batch, heads, seq_q, head_dim], k and v [batch, kv_heads,
seq_kv, head_dim], o like q; fp16 by default. Query head h reads K/V head
h // (heads // kv_heads) (GQA; kv_heads == heads is plain multi-head attention).
Causal masks are aligned to the end of the keys: query i sees keys <= i + seq_kv - seq_q.

FlashAttention and flash-decoding read K and V from a KV cache in any of
kv_cache_write's layouts (`kv_layout`: per_layer, contiguous, paged), through the
same `KvCache` addresses and GM tensor names (per_layer "k_cache" / "v_cache",
contiguous "kv_cache", paged "k_cache" / "v_cache" / "block_table"), so a graph binds
the writer's and the readers' names to the same tensors. The layout changes what a
K/V load is: one segment per run of tokens (per_layer), rows carrying K and V side
by side (contiguous), one segment per block in scattered order plus the block-table
read (paged).

Broadcast of a per-row statistic (the running max, sum or rescale factor) is one
vector instruction over the whole tile: the statistics sit in UB as 32-byte
blocks per row (what Brcb produces), and the binary op reads them with a zero
repeat stride. # assumption: no per-row instruction or scalar round trip
"""

from npusim.ops.attention import decode, flash, unfused  # noqa: F401  (register their op types)
from npusim.ops.attention.common import AttentionParams, FlashAttentionParams
from npusim.ops.attention.decode import DecodeAttentionParams, DecodeAttentionTiling, choose_decode_tiling
from npusim.ops.attention.flash_tiling import FlashAttentionTiling, choose_flash_tiling

__all__ = ["AttentionParams", "DecodeAttentionParams", "DecodeAttentionTiling", "FlashAttentionParams",
           "FlashAttentionTiling", "choose_decode_tiling", "choose_flash_tiling"]
