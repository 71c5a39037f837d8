"""KV-cache layout: per-layer tensors (the baseline), one contiguous tensor, or paged blocks.

- per_layer: a K and a V tensor [batch, kv_heads, context, head_dim] per layer.
- contiguous: one tensor [batch, layers, kv_heads, context, row] for every layer,
  a token's K and V side by side in one row padded to the DMA burst: a new
  token is one aligned segment per head instead of two.
- paged: per layer K and V pools of blocks [blocks, kv_heads, block_tokens,
  head_dim] and one block table [batch, blocks per sequence] (int32) shared by
  the layers, blocks scattered as after a serving run's churn.
The writer (kv_cache_write) and the readers (decode_attention, flash_attention)
address the cache through the same layout description (npusim.ops.layout.KvCache).
The unfused attention chain's batch matmuls read per-layer caches only: without
the flash_attention fusion the pass keeps the per-layer layout and says so in
the graph's applied passes.
"""

from __future__ import annotations

import attrs

from npusim.errors import ConfigError
from npusim.graph.ir import DTYPE_BYTES, Graph, TensorSpec
from npusim.ops.layout import KV_CACHE_NAMES, KV_READERS
from npusim.passes.graph_edit import Editor

KV_LAYOUTS = ("contiguous", "paged")
SKIPPED = "kv_layout (skipped: the unfused attention reads per-layer caches)"


def change_kv_layout(graph: Graph, kv_layout: str = "contiguous", block_tokens: int = 128,
                     row_align_bytes: int = 64) -> Graph:
    """The graph with its KV caches in `kv_layout`. row_align_bytes: what a contiguous
    row is padded to - the DMA burst of the config it will run on (the runtime
    checks that the op's tensor fits the graph's)."""
    if kv_layout not in KV_LAYOUTS:
        raise ConfigError(f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {kv_layout!r}")
    ed = Editor(graph)
    writers = [n for n in ed.nodes if n.op_type == "kv_cache_write"]
    if not writers:
        return ed.graph("kv_layout")
    per_layer = {t for n in writers for t in n.outputs.values()}
    if any(n.op_type not in KV_READERS and per_layer & set(n.inputs.values()) for n in ed.nodes):
        return ed.graph(SKIPPED)
    p0 = writers[0].params
    b, layers, h, ctx, d = p0["batch"], p0["layers"], p0["kv_heads"], p0["context"], p0["head_dim"]
    dt = p0.get("dtype", "fp16")
    e = DTYPE_BYTES[dt]
    extra = dict(layout=kv_layout, block_tokens=block_tokens)
    shared: dict[str, str] = {}
    if kv_layout == "contiguous":
        row = -(-2 * d * e // row_align_bytes) * row_align_bytes // e
        shared["kv_cache"] = ed.add_tensor(TensorSpec("kv_cache", (b, layers, h, ctx, row), dt, kind="kv"))
    else:
        blocks = b * -(-ctx // block_tokens)
        shared["block_table"] = ed.add_tensor(TensorSpec("block_table", (b, blocks // b), "int32", kind="kv"))
    rename: dict[str, dict[str, str]] = {}  # reader node -> its new cache inputs
    new_nodes = []
    for n in ed.nodes:
        if n.op_type == "kv_cache_write":
            k_cache, v_cache = n.outputs["k_cache"], n.outputs["v_cache"]
            if kv_layout == "contiguous":
                outs, ins = {"kv_cache": shared["kv_cache"]}, {}
                tensors = dict(zip(KV_CACHE_NAMES["contiguous"], (shared["kv_cache"],)))
            else:
                pool = (blocks, h, block_tokens, d)
                for t in (k_cache, v_cache):
                    ed.tensors[t] = attrs.evolve(ed.tensors[t], shape=pool)
                outs, ins = {"k_cache": k_cache, "v_cache": v_cache}, {"block_table": shared["block_table"]}
                tensors = dict(zip(KV_CACHE_NAMES["paged"], (k_cache, v_cache, shared["block_table"])))
            for reader in ed.readers(k_cache) + ed.readers(v_cache):
                rename[reader.name] = tensors
            n = attrs.evolve(n, params=dict(n.params, **extra), inputs=dict(n.inputs, **ins), outputs=outs)
        elif n.name in rename:
            kept = {k: t for k, t in n.inputs.items() if t not in per_layer}
            n = attrs.evolve(n, params=dict(n.params, kv_layout=kv_layout, layers=layers, layer=n.layer or 0,
                                            block_tokens=block_tokens),
                             inputs=kept | rename[n.name])
        new_nodes.append(n)
    ed.nodes = new_nodes
    return ed.graph("kv_layout")


__all__ = ["KV_LAYOUTS", "change_kv_layout"]
