"""KV-cache layout: per-layer tensors (the baseline), one contiguous tensor, or paged blocks.

- per_layer: a K and a V tensor [batch, kv_heads, context, head_dim] per layer.
- contiguous: one tensor [batch, layers, kv_heads, context, row] for every layer,
  a token's K and V side by side in one row padded to the DMA burst: a new
  token is one aligned segment per head instead of two.
- paged: per layer K and V pools of blocks [blocks, kv_heads, block_tokens,
  head_dim] and one block table [batch, blocks per sequence] (int32) shared by
  the layers, blocks scattered as after a serving run's churn.
The writer (kv_cache_write) and the readers (decode_attention, flash_attention)
address the cache through the same layout value (npusim.kvcache.KvLayout), which
also gives the pass its tensors' shapes.
The unfused attention chain's batch matmuls read per-layer caches only: without
the flash_attention fusion the pass keeps the per-layer layout and says so in
the graph's applied passes.
"""

from __future__ import annotations

import attrs

from npusim.errors import ConfigError
from npusim.graph.ir import Graph, TensorSpec
from npusim.hw import HwConfig
from npusim.kvcache import KV_CACHE_NAMES, PASS_KV_LAYOUTS
from npusim.ops import KV_READERS
from npusim.ops.kv_cache import kv_row_align_bytes
from npusim.ops.registry import default_hw
from npusim.passes.graph_edit import Editor

KV_LAYOUTS = PASS_KV_LAYOUTS  # the layouts this pass makes (npusim.kvcache's, but the baseline per_layer)
SKIPPED = "kv_layout (skipped: the unfused attention reads per-layer caches)"


def change_kv_layout(graph: Graph, kv_layout: str = "contiguous", block_tokens: int = 128,
                     hw: HwConfig | None = None) -> Graph:
    """The graph with its KV caches in `kv_layout`. A contiguous row is padded to the
    DMA burst of `hw`, the config it will run on (the default config's without one;
    the runtime checks that the op's tensor fits the graph's)."""
    if kv_layout not in KV_LAYOUTS:
        raise ConfigError(f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {kv_layout!r}")
    ed = Editor(graph)
    writers = [n for n in ed.nodes if n.op_type == "kv_cache_write"]
    if not writers:
        return ed.graph("kv_layout")
    per_layer = {t for n in writers for t in n.outputs.values()}
    if any(n.op_type not in KV_READERS and per_layer & set(n.inputs.values()) for n in ed.nodes):
        return ed.graph(SKIPPED)
    def shapes_of(args) -> dict:
        return attrs.evolve(args.kv_cache(kv_row_align_bytes(hw or default_hw())), layout=kv_layout,
                            block_tokens=block_tokens).tensor_shapes()

    # a mixed step's attention parts each have a cache of their batch: the shared tensors hold the largest
    p0 = max((n.args for n in writers), key=lambda a: a.batch)
    layers = p0.layers
    shapes = shapes_of(p0)
    extra = dict(layout=kv_layout, block_tokens=block_tokens)
    shared: dict[str, str] = {}
    for name in ("kv_cache", "block_table"):  # the tensors every layer shares
        if name in shapes:
            shared[name] = ed.add_tensor(TensorSpec(name, *shapes[name], kind="kv"))
    rename: dict[str, dict[str, str]] = {}  # reader node -> its new cache inputs
    new_nodes = []
    for n in ed.nodes:
        if n.op_type == "kv_cache_write":
            k_cache, v_cache = n.outputs["k_cache"], n.outputs["v_cache"]
            if kv_layout == "contiguous":
                outs, ins = {"kv_cache": shared["kv_cache"]}, {}
                tensors = dict(zip(KV_CACHE_NAMES["contiguous"], (shared["kv_cache"],)))
            else:
                own = shapes_of(n.args)
                for t, local in ((k_cache, "k_cache"), (v_cache, "v_cache")):
                    ed.tensors[t] = attrs.evolve(ed.tensors[t], shape=own[local][0])
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
