"""A KV cache op's layers are one kernel at other addresses (runtime.compile._reuse_key):
its `layer` moves only the cache bytes it touches, so the engine may replay one layer's
attention and cache write for another's (engine.device.Reuse)."""

import attrs
import pytest

from npusim.graph.build import build_decoder
from npusim.hw import load_hw
from npusim.kvcache import KvLayout
from npusim.ops.kv_cache import kv_row_align_bytes
from npusim.ops.registry import GmArena, lower
from npusim.passes import apply
from npusim.runtime.compile import compile_nodes, host_program
from npusim.runtime.memory import place

HW = load_hw("ascend910b2")
LAYERS, LAYER = 4, 3
SHAPE = dict(batch=2, kv_heads=2, head_dim=64, dtype="fp16", layers=LAYERS)
# (op, its params but the layout, the name of its layout parameter, its own operands)
OPS = [
    ("flash_attention", dict(heads=4, seq_q=32, seq_kv=96, causal=True, block_tokens=32), "kv_layout", ("q", "o")),
    ("decode_attention", dict(heads=4, context=96, block_tokens=32), "kv_layout", ("q", "o")),
    ("kv_cache_write", dict(context=96, new_tokens=1, block_tokens=32), "layout", ("k", "v")),
]
CACHE = {"per_layer": ("k_cache", "v_cache"), "contiguous": ("kv_cache",),
         "paged": ("k_cache", "v_cache", "block_table")}


def _cache(layout: str, kw: dict, layer: int) -> KvLayout:
    context = kw.get("seq_kv", kw.get("context"))
    return KvLayout(layout, SHAPE["batch"], SHAPE["kv_heads"], context, SHAPE["head_dim"], "fp16", LAYERS, layer,
                    kw["block_tokens"], kv_row_align_bytes(HW))


def _shift(layout: str, kw: dict) -> int:
    """How much further on the layer's tokens lie in the cache tensor than layer 0's."""
    context = kw.get("seq_kv", kw.get("context"))
    first = {layer: next(iter(_cache(layout, kw, layer).parts(0, context).values()))[0][0] for layer in (0, LAYER)}
    return first[LAYER] - first[0]


@pytest.mark.parametrize("layout", ["per_layer", "contiguous", "paged"])
@pytest.mark.parametrize("op,kw,layout_key,own", OPS, ids=[o[0] for o in OPS])
def test_a_layer_is_layer_0_with_its_cache_moved(op, kw, layout_key, own, layout):
    """Lowered for layer 3, a cache op is its layer-0 lowering with the cache tensor bound
    that layer's first part further on: every instruction, address and flag the same."""
    addr = {name: 0x1000_0000 * (i + 1) for i, name in enumerate((*own, *CACHE[layout]))}
    shift = _shift(layout, kw)
    if layout == "contiguous":
        assert shift > 0 and shift % HW.l2.line_bytes == 0
    params = {**SHAPE, **kw, layout_key: layout}
    at_layer = lower(op, {**params, "layer": LAYER}, HW, gm=GmArena(addr))
    moved = {k: a + (shift if k == "kv_cache" else 0) for k, a in addr.items()}
    at_0 = lower(op, {**params, "layer": 0}, HW, gm=GmArena(moved))
    assert len(at_layer.kernels) == len(at_0.kernels)
    for a, b in zip(at_layer.kernels, at_0.kernels):
        assert attrs.evolve(a, gm=()) == attrs.evolve(b, gm=())
        assert [(t.name, t.addr + (shift if t.name == "kv_cache" else 0)) for t in a.gm] == \
            [(t.name, t.addr) for t in b.gm]


def test_a_layer_that_moves_the_program_is_told_apart():
    """The check above can fail: a layer whose cache is not moved gives other addresses."""
    op, kw, layout_key, own = OPS[0]
    addr = {name: 0x1000_0000 * (i + 1) for i, name in enumerate((*own, "kv_cache"))}
    params = {**SHAPE, **kw, layout_key: "contiguous"}
    a = lower(op, {**params, "layer": LAYER}, HW, gm=GmArena(addr)).kernels[0]
    b = lower(op, {**params, "layer": 0}, HW, gm=GmArena(addr)).kernels[0]
    assert attrs.evolve(a, gm=()) != attrs.evolve(b, gm=())


def test_the_parts_of_a_cache_are_its_tokens_bytes():
    """KvLayout.parts: a layer's every token is its run of the contiguous cache in each
    sequence, and the whole of its own per_layer tensors; one new token is one row (K and
    V) per sequence and head, or a head_dim of K and one of V per layout tensor."""
    kw = dict(context=96, block_tokens=32)
    run = SHAPE["kv_heads"] * 96 * 256  # a sequence's tokens of one layer: rows of 256 bytes
    assert _cache("contiguous", kw, LAYER).parts(0, 96) == {
        "kv_cache": tuple(((b * LAYERS + LAYER) * run, run) for b in range(SHAPE["batch"]))}
    whole = SHAPE["batch"] * SHAPE["kv_heads"] * 96 * 128
    assert _cache("per_layer", kw, LAYER).parts(0, 96) == {"k_cache": ((0, whole),), "v_cache": ((0, whole),)}
    for layout, pitch in (("contiguous", 256), ("per_layer", 128), ("paged", 128)):
        parts = _cache(layout, kw, LAYER).parts(95, 1)
        assert all(len(p) == SHAPE["batch"] * SHAPE["kv_heads"] and {b for _, b in p} == {pitch}
                   for p in parts.values()), (layout, parts)


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_a_steps_layers_share_their_cache_ops_key_and_touch_their_part(phase):
    """In a K3-tiny step (contiguous cache), every layer's attention and cache write carry
    one replay key; an attention's footprint in the cache is its layer's part of each
    sequence, a cache write's the rows it writes (in decode one a sequence and head)."""
    graph = apply(build_decoder("k3-tiny", phase, 2, [48, 40]), "optimized", hw=HW)
    placement = place(graph, HW.hbm.hbm_bytes)
    compiled = compile_nodes(graph, graph.nodes, HW, placement)
    program = host_program(graph, compiled, placement.addresses, replay=True)
    layers = sorted({n.layer for n in graph.nodes if n.layer is not None})
    base, whole = placement.addresses["kv_cache"], graph.tensors["kv_cache"].nbytes
    run = whole // (2 * len(layers))  # one sequence's part of one layer
    seen = set()
    for c, n in zip(program.calls, program.owners):
        node = graph.node(n) if n is not None else None
        if getattr(c, "reuse", None) is None or node.op_type not in ("flash_attention", "decode_attention",
                                                                        "kv_cache_write"):
            continue
        seen.add(node.op_type)
        parts = sorted({(a - base, b) for a, b in (*c.reuse.reads, *c.reuse.writes) if base <= a < base + whole})
        if node.op_type != "kv_cache_write":
            assert parts == [((b * len(layers) + node.layer) * run, run) for b in range(2)]
        elif phase == "decode":
            assert len(parts) == 2 * node.args.kv_heads and all(b <= 256 for _, b in parts), parts
        else:  # the whole prompt: the layer's part of each sequence
            assert parts == [((b * len(layers) + node.layer) * run, run) for b in range(2)]
    assert len(seen) == 2
    for op in seen:
        keys = {c.reuse.key for c, n in zip(program.calls, program.owners)
                if getattr(c, "reuse", None) is not None and graph.node(n).op_type == op}
        assert len(keys) == 1, op
