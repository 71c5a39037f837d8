"""The numpy executor on graphs a pass would make: fused attention (decode_attention,
flash_attention) against the unfused chain, each KV layout against per_layer (same
outputs, same logical caches), the starting caches of each layout, and a fused QKV
projection (matmul n_parts, a derived weight) against the three projections.

The graphs are edited by hand here (attrs.evolve, new Node records), so these tests
check the executor's semantics, not the passes."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from npusim.graph import Node, build_decoder, cosine, execute, random_weights
from npusim.graph.execute import logical_kv, random_kv
from npusim.graph.ir import DTYPE_BYTES, Graph, TensorSpec
from npusim.hw import load_hw
from npusim.ops.kv_cache import KvCache, kv_row_bytes
from npusim.ops.registry import GmArena, lower
from npusim.workload import load_workload

TINY = load_workload("k3-tiny")
HW = load_hw("ascend910b2")
CHAIN = ("qk", "scale", "mask", "softmax", "pv")


def fuse_attention(g: Graph) -> Graph:
    """Each layer's QK^T -> scale -> [mask] -> softmax -> PV chain as one decode_attention
    (decode) or causal flash_attention (prefill) node reading the per-layer caches."""
    w = g.workload
    nodes = []
    for n in g.nodes:
        op = n.name.split(".", 1)[-1] if n.layer is not None else ""
        if op not in CHAIN:
            nodes.append(n)
            continue
        if op != "qk":
            continue
        L = f"L{n.layer}."
        common = dict(batch=g.batch, heads=w.heads, kv_heads=w.kv_heads, head_dim=w.head_dim, dtype=w.dtype)
        ins = {"q": n.inputs["a"], "k_cache": n.inputs["b"], "v_cache": g.node(L + "pv").inputs["b"]}
        outs = {"o": g.node(L + "pv").outputs["c"]}
        if g.phase == "decode":
            nodes.append(Node(L + "attention", "decode_attention", common | dict(context=g.context), ins, outs,
                              n.layer))
        else:
            nodes.append(Node(L + "attention", "flash_attention",
                              common | dict(seq_q=g.seq, seq_kv=g.context, causal=True), ins, outs, n.layer))
    return attrs.evolve(g, nodes=nodes).check()


def with_layout(g: Graph, layout: str, block_tokens: int = 4, row: int | None = None) -> Graph:
    """The fused graph with its caches in `layout`: one contiguous tensor "kv_cache"
    [batch, layers, kv_heads, context, row] (row in elements: the burst-aligned K + V by
    default), or per-layer pools [blocks, kv_heads, block_tokens, head_dim] under the
    per-layer names and one shared "block_table"."""
    w = g.workload
    b, h, ctx, d = g.batch, w.kv_heads, g.context, w.head_dim
    tensors = dict(g.tensors)
    layers = w.layers
    if layout == "contiguous":
        row = row or kv_row_bytes(d, w.dtype, HW) // DTYPE_BYTES[w.dtype]
        for t in [t for t in tensors if t.endswith(("k_cache", "v_cache"))]:
            del tensors[t]
        tensors["kv_cache"] = TensorSpec("kv_cache", (b, layers, h, ctx, row), w.dtype, kind="kv")
    else:
        blocks = b * -(-ctx // block_tokens)
        for t in [t for t in tensors if t.endswith(("k_cache", "v_cache"))]:
            tensors[t] = attrs.evolve(tensors[t], shape=(blocks, h, block_tokens, d))
        tensors["block_table"] = TensorSpec("block_table", (b, blocks // b), "int32", kind="kv")
    nodes = []
    for n in g.nodes:
        if n.op_type in ("kv_cache_write", "decode_attention", "flash_attention"):
            caches = {k: t for k, t in (n.inputs | n.outputs).items() if k.endswith("_cache")}
            new = {"kv_cache": "kv_cache"} if layout == "contiguous" else caches | {"block_table": "block_table"}
            key = "layout" if n.op_type == "kv_cache_write" else "kv_layout"
            params = n.params | {key: layout, "layers": layers, "layer": n.layer, "block_tokens": block_tokens}
            if n.op_type == "kv_cache_write":
                ins = {k: t for k, t in n.inputs.items()} | ({"block_table": "block_table"} if layout == "paged"
                                                              else {})
                outs = {k: t for k, t in new.items() if k != "block_table"}
            else:
                ins, outs = {"q": n.inputs["q"]} | new, n.outputs
            n = attrs.evolve(n, params=params, inputs=ins, outputs=outs)
        nodes.append(n)
    return attrs.evolve(g, tensors=tensors, nodes=nodes).check()


@pytest.mark.parametrize("lengths", [[10, 7], [9, 9]])
def test_decode_attention_computes_what_the_unfused_chain_does(lengths):
    g = build_decoder(TINY, "decode", 2, lengths)
    fused = fuse_attention(g)
    assert fused.count_by_type()["decode_attention"] == TINY.layers
    ref, ref_f = execute(g, "reference", seed=1), execute(fused, "reference", seed=1)
    np.testing.assert_allclose(ref_f.outputs["logits"], ref.outputs["logits"], rtol=1e-4, atol=1e-4)
    for k in ref.kv:  # layer 0's new K and V are the same; later layers' within fp32 noise
        np.testing.assert_allclose(ref_f.kv[k], ref.kv[k], rtol=1e-4, atol=1e-4)
    dev, dev_f = execute(g, "device", seed=1), execute(fused, "device", seed=1)
    assert cosine(dev_f.outputs["logits"], dev.outputs["logits"]) >= 0.999
    assert cosine(dev_f.outputs["logits"], ref.outputs["logits"]) >= 0.999


def test_flash_attention_prefill_computes_what_the_unfused_chain_does():
    g = build_decoder(TINY, "prefill", 2, [12, 7])
    ref, ref_f = execute(g, "reference", seed=2), execute(fuse_attention(g), "reference", seed=2)
    np.testing.assert_allclose(ref_f.outputs["logits"], ref.outputs["logits"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("phase, lengths", [("decode", [10, 7]), ("prefill", [12, 7])])
@pytest.mark.parametrize("layout, block_tokens", [("contiguous", 4), ("paged", 4), ("paged", 16)])
def test_every_layout_computes_what_per_layer_computes(phase, lengths, layout, block_tokens):
    """Same starting logical caches, same arithmetic: the outputs are bit-identical,
    and the caches after the step hold the same per-layer values."""
    per_layer = fuse_attention(build_decoder(TINY, phase, 2, lengths))
    g = with_layout(per_layer, layout, block_tokens)
    base, ex = execute(per_layer, "device", seed=3), execute(g, "device", seed=3)
    for name in base.outputs:
        assert np.array_equal(ex.outputs[name], base.outputs[name]), name
    assert "block_table" in ex.kv or layout != "paged"
    after = logical_kv(g, ex.kv)
    assert after.keys() == base.kv.keys()
    for name, x in base.kv.items():
        assert np.array_equal(after[name], x), name
    assert logical_kv(per_layer, base.kv).keys() == base.kv.keys()


@pytest.mark.parametrize("phase, layout", [("decode", "contiguous"), ("decode", "paged"), ("prefill", "paged")])
def test_cache_nodes_lower_onto_the_graph_tensors(phase, layout):
    """Writer and reader name the same GM tensors, with the graph tensors' sizes."""
    g = with_layout(fuse_attention(build_decoder(TINY, phase, 2, [12, 7])), layout)
    for n in g.nodes:
        if n.op_type in ("kv_cache_write", "decode_attention", "flash_attention"):
            gm = GmArena()
            lower(n.op_type, n.params, HW, gm=gm)
            for local, t in (n.inputs | n.outputs).items():
                assert gm.tensors[local].nbytes == g.tensors[t].nbytes, (n.name, local)


def test_random_kv_packs_the_per_layer_values():
    """Contiguous: K then V in each row, padding zero; paged: the blocks where the
    block table (KvCache's scattered order) says, the table returned too."""
    per_layer = fuse_attention(build_decoder(TINY, "decode", 2, [10, 7]))
    want = random_kv(per_layer, seed=5)
    d = TINY.head_dim
    g = with_layout(per_layer, "contiguous", row=2 * d + 32)
    kv = random_kv(g, seed=5)
    rows = kv["kv_cache"]
    assert rows.shape == (2, TINY.layers, TINY.kv_heads, 10, 2 * d + 32)
    assert not rows[..., 2 * d:].any()
    for i in range(TINY.layers):
        assert np.array_equal(rows[:, i, ..., :d], want[f"L{i}.k_cache"])
        assert np.array_equal(rows[:, i, ..., d:2 * d], want[f"L{i}.v_cache"])
    assert logical_kv(g, kv).keys() == want.keys()

    g = with_layout(per_layer, "paged", block_tokens=4)
    kv = random_kv(g, seed=5)
    cache = KvCache.of(HW, GmArena(), batch=2, kv_heads=TINY.kv_heads, head_dim=d, context=10, dtype=TINY.dtype,
                       layout="paged", layers=TINY.layers, layer=0, block_tokens=4)
    table = kv["block_table"]
    assert table.dtype == np.int32 and table.shape == (2, 3)
    assert table.tolist() == [[cache.physical_block(b, j) for j in range(3)] for b in range(2)]
    assert sorted(table.ravel().tolist()) == list(range(6)) and table.ravel().tolist() != list(range(6))
    pool = kv["L1.v_cache"]  # sequence 1, token 5: block 1, slot 1
    assert np.array_equal(pool[table[1, 1], :, 1], want["L1.v_cache"][1, :, 5])
    for name, x in logical_kv(g, kv).items():
        assert np.array_equal(x, want[name])


def fuse_qkv(g: Graph) -> Graph:
    """Each layer's q, k, v projections as one matmul over the concatenated (derived)
    weight - and bias - writing q, k and v as its column parts c0, c1, c2."""
    nodes, tensors, derived = [], dict(g.tensors), {}
    for n in g.nodes:
        if n.op_type != "matmul" or n.layer is None or not n.name.endswith(("k_proj", "v_proj", "q_proj")):
            nodes.append(n)
            continue
        if not n.name.endswith("q_proj"):
            continue
        L = f"L{n.layer}."
        group = [g.node(L + f"{x}_proj") for x in "qkv"]
        widths = tuple(m.params["n"] for m in group)
        ins = {"a": n.inputs["a"]}
        for local in ("b", "bias") if n.params.get("bias") else ("b",):
            names = tuple(m.inputs[local] for m in group)
            fused = "+".join(names)
            specs = [tensors.pop(t) for t in names]
            tensors[fused] = attrs.evolve(specs[0], name=fused, shape=(sum(widths), *specs[0].shape[1:]))
            derived[fused] = names
            ins[local] = fused
        outs = {f"c{i}": m.outputs["c"] for i, m in enumerate(group)}
        nodes.append(Node(L + "qkv_proj", "matmul", n.params | dict(n=sum(widths), n_parts=widths), ins, outs,
                          n.layer))
    return attrs.evolve(g, tensors=tensors, nodes=nodes, derived=derived).check()


@pytest.mark.parametrize("bias", [False, True])
def test_a_fused_qkv_projection_computes_what_three_do(bias):
    w = attrs.evolve(TINY, qkv_bias=bias)
    g = build_decoder(w, "decode", 2, [10, 7])
    fused = fuse_qkv(g)
    assert "L0.wq" not in fused.tensors and fused.derived["L0.wq+L0.wk+L0.wv"] == ("L0.wq", "L0.wk", "L0.wv")
    a, b = random_weights(g, seed=4), random_weights(fused, seed=4)
    assert np.array_equal(b["L1.wq+L1.wk+L1.wv"], np.concatenate([a["L1.wq"], a["L1.wk"], a["L1.wv"]]))
    if bias:
        assert np.array_equal(b["L0.bq+L0.bk+L0.bv"], np.concatenate([a["L0.bq"], a["L0.bk"], a["L0.bv"]]))
    ref, ref_f = execute(g, "reference", seed=4), execute(fused, "reference", seed=4)
    np.testing.assert_allclose(ref_f.outputs["logits"], ref.outputs["logits"], rtol=1e-5, atol=1e-5)
    dev, dev_f = execute(g, "device", seed=4), execute(fused, "device", seed=4)
    assert cosine(dev_f.outputs["logits"], dev.outputs["logits"]) >= 0.9999
