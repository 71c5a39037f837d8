"""The decoder graph: the baseline builder's structure (node counts, shapes, tensor
kinds), every node lowering through the operator registry with its tensors mapped
to the op's own GM names, the structural checks, and the numpy executor (device vs
FP32 reference, determinism, agreement with a plain numpy forward pass, ragged
batches, prefill -> decode consistency, FP16 overflow flags)."""

from __future__ import annotations

from collections import Counter

import attrs
import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.graph import (
    Graph, GraphError, Node, build_decoder, cosine, execute, host_inputs, random_weights,
)
from npusim.graph.build import rope_tables
from npusim.graph.execute import round_to
from npusim.hw import load_hw
from npusim.ops.registry import GmArena, lower
from npusim.workload import load_workload

TINY = load_workload("k3-tiny")

# every matmul's activation goes ND -> NZ through its own trans_data (the naive framework's)
PER_LAYER = {"rms_norm": 2, "matmul": 7, "trans_data": 7, "rope": 2, "kv_cache_write": 1, "batch_matmul": 2,
             "scale": 1, "softmax": 1, "add": 2, "silu": 1, "mul": 1}
OUTSIDE = {"embedding": 1, "rms_norm": 1, "matmul": 1, "trans_data": 1, "argmax": 1}


def _counts(nodes) -> dict[str, int]:
    return dict(Counter(n.op_type for n in nodes))


# ---- structure


@pytest.mark.parametrize("phase, lengths, per_layer, outside", [
    ("decode", 64, PER_LAYER, OUTSIDE),  # 27 per layer + 5
    ("decode", [40, 17, 64], PER_LAYER | {"add": 3}, OUTSIDE),  # ragged: + padding mask = 28 + 5
    ("prefill", [16, 11, 16], PER_LAYER | {"add": 3}, OUTSIDE | {"embedding": 2}),  # + causal mask, gather = 28 + 6
])
def test_node_counts(phase, lengths, per_layer, outside):
    g = build_decoder(TINY, phase, 3, lengths)
    for i in range(TINY.layers):
        assert _counts(g.layer_nodes(i)) == per_layer
    assert _counts([n for n in g.nodes if n.layer is None]) == outside
    assert len(g.nodes) == TINY.layers * sum(per_layer.values()) + sum(outside.values())


def test_decode_shapes_and_kinds():
    g = build_decoder(TINY, "decode", 2, [10, 7])
    t = g.tensors
    assert (g.seq, g.context, g.tokens, g.lengths) == (1, 10, 2, (10, 7))
    assert g.inputs == ("tokens", "rope_cos", "rope_sin", "attn_mask") and g.outputs == ("logits", "next_tokens")
    assert t["L0.k_cache"].shape == (2, 2, 10, 64) and t["L0.k_cache"].kind == "kv"
    assert t["L0.q_rot"].shape == (2, 1, 4, 64) and t["L0.q_rot"].format == "BSND"
    assert t["L1.scores"].shape == (2, 4, 1, 10)
    assert t["logits"].shape == (2, 1000) and t["logits"].kind == "output"
    assert t["next_tokens"].dtype == "int32"
    # GQA folds the 2 query heads of each K/V head into M
    qk = g.node("L0.qk").params
    assert (qk["batch"], qk["m"], qk["n"], qk["k"], qk["trans_b"]) == (4, 2, 10, 64, True)
    # weights are Linear [out, in] used with trans_b; one per name
    assert t["L0.wk"].shape == (128, 256) and g.node("L0.k_proj").params["trans_b"]
    assert {s.name for s in g.of_kind("weight")} == set(TINY.weight_shapes())


def test_k3_graph_holds_the_workload_bytes():
    w = load_workload("k3")
    g = build_decoder(w, "decode", 8, 4096)
    assert len(g.nodes) == 32 * 27 + 5
    by_kind = g.bytes_by_kind()
    assert by_kind["weight"] == w.weight_bytes
    assert by_kind["kv"] == w.kv_bytes(8, 4096)
    assert "k3" in g.summary() and "27 nodes per layer x 32 layers" in g.summary()


def test_helpers():
    g = build_decoder(TINY, "prefill", 1, 8)
    assert g.producer("L0.q").name == "L0.q_proj"
    assert [n.name for n in g.consumers("L0.attn_norm_out")] == ["L0.q_proj.to_nz", "L0.k_proj.to_nz",
                                                                  "L0.v_proj.to_nz"]
    assert g.producers()["L1.k_cache"] == ["L1.kv_cache_write"]
    assert [n.name for n in g.consumers("attn_mask")] == ["L0.mask", "L1.mask"]
    assert g.producer("tokens") is None
    assert repr(g) == "Graph(k3-tiny, prefill, batch=1, lengths=1 x 8, 62 nodes, 90 tensors)"


def test_tied_embeddings_share_the_table():
    g = build_decoder(attrs.evolve(TINY, tie_embeddings=True), "decode", 1, 4)
    assert g.node("lm_head").inputs["b"] == "embed" and "lm_head" not in g.tensors


# ---- every node lowers, and its tensors are the op's GM tensors


@pytest.mark.parametrize("phase, batch, lengths", [("decode", 2, [10, 7]), ("decode", 1, 512),
                                                   ("prefill", 2, [16, 11])])
def test_every_node_lowers_with_matching_tensors(phase, batch, lengths):
    hw = load_hw()
    g = build_decoder(TINY, phase, batch, lengths)
    for n in g.nodes:
        gm = GmArena()
        lower(n.op_type, n.params, hw, gm=gm)
        mapped = n.inputs | n.outputs
        assert set(gm.tensors) - {"workspace"} == set(mapped), n.name
        for local, t in mapped.items():  # same bytes in GM as in the graph
            assert gm.tensors[local].nbytes == g.tensors[t].nbytes, (n.name, local)


def test_qwen_bias_graph_lowers():
    hw = load_hw()
    w = attrs.evolve(load_workload("qwen2.5-7b"), layers=1)
    g = build_decoder(w, "decode", 2, 64)
    n = g.node("L0.q_proj")
    assert n.params["bias"] and n.inputs["bias"] == "L0.bq" and g.tensors["L0.bq"].dtype == "fp32"
    for node in g.layer_nodes(0):
        lower(node.op_type, node.params, hw)


# ---- checks


def test_bad_lengths():
    with pytest.raises(ConfigError, match=r"length 600 exceeds the workload's max_context_tokens 512"):
        build_decoder(TINY, "decode", 1, 600)
    with pytest.raises(ConfigError, match=r"2 lengths for batch 3"):
        build_decoder(TINY, "decode", 3, [4, 5])
    with pytest.raises(ConfigError, match=r"phase must be decode or prefill"):
        build_decoder(TINY, "train", 1, 4)
    with pytest.raises(ConfigError, match=r"batch must be a positive integer"):
        build_decoder(TINY, "decode", 0, 4)


def test_check_catches_broken_graphs():
    g = build_decoder(TINY, "decode", 1, 4)
    nodes = list(g.nodes)
    swapped = nodes[:1] + [nodes[2], nodes[1]] + nodes[3:]  # q_proj's input conversion before the norm it reads
    with pytest.raises(GraphError,
                       match=r"node 'L0.q_proj.to_nz' reads 'L0.attn_norm_out' before any node writes it"):
        attrs.evolve(g, nodes=swapped).check()
    bad = attrs.evolve(nodes[1], params=nodes[1].params | {"epsilon": 1.0})
    with pytest.raises(GraphError, match=r"'epsilon' is not a parameter of rms_norm"):
        attrs.evolve(g, nodes=[nodes[0], bad] + nodes[2:]).check()
    with pytest.raises(GraphError, match=r"unknown op type 'layernorm'"):
        attrs.evolve(g, nodes=[nodes[0], attrs.evolve(nodes[1], op_type="layernorm")] + nodes[2:]).check()
    twice = Node("again", "add", {"shape": (1, 256)}, {"x1": "embeddings", "x2": "embeddings"}, {"y": "L0.q"})
    with pytest.raises(GraphError, match=r"writes 'L0.q', already written by 'L0.q_proj'"):
        attrs.evolve(g, nodes=nodes + [twice]).check()
    with pytest.raises(GraphError, match=r"no tensor 'nope'"):
        attrs.evolve(g, outputs=("nope",)).check()


# ---- the numpy executor


def test_device_matches_reference_and_is_deterministic():
    g = build_decoder(TINY, "decode", 2, [10, 7])
    dev, ref = execute(g, "device", seed=3), execute(g, "reference", seed=3)
    assert cosine(dev.outputs["logits"], ref.outputs["logits"]) >= 0.999
    assert np.array_equal(dev.outputs["next_tokens"], ref.outputs["next_tokens"])
    assert dev.overflow == () and ref.overflow == ()
    for k in dev.kv:
        assert cosine(dev.kv[k], ref.kv[k]) >= 0.999
    again = execute(g, "device", seed=3)
    for k in dev.outputs:
        assert np.array_equal(dev.outputs[k], again.outputs[k])
    other = execute(g, "device", seed=4)
    assert not np.array_equal(dev.outputs["logits"], other.outputs["logits"])
    # device mode stores fp16: every stored value is exactly representable
    assert np.array_equal(dev.outputs["logits"], dev.outputs["logits"].astype(np.float16).astype(np.float32))


def test_weights_do_not_depend_on_graph_order_or_phase():
    a = random_weights(build_decoder(TINY, "decode", 1, 4), seed=0)
    b = random_weights(build_decoder(TINY, "prefill", 2, 8), seed=0)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _plain_forward(w, weights: dict, tokens: np.ndarray) -> np.ndarray:
    """A Llama-style forward of one sequence in float32, written independently of the
    graph (repeat_kv GQA, causal softmax); returns the last token's logits."""
    W = {k: round_to(v, w.dtype) for k, v in weights.items()}
    T, d, H, KV = len(tokens), w.head_dim, w.heads, w.kv_heads
    cos, sin = (round_to(a, w.dtype)[:, None, :] for a in rope_tables(np.arange(T), d, w.rope_theta))

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + w.norm_eps) * g

    def rope(v):
        return v * cos + np.concatenate([-v[..., d // 2:], v[..., :d // 2]], -1) * sin

    x = W["embed"][tokens]
    causal = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], 0.0, -np.inf)
    for i in range(w.layers):
        p = {k.split(".", 1)[1]: v for k, v in W.items() if k.startswith(f"L{i}.")}
        h = rms(x, p["attn_norm"])
        q = rope((h @ p["wq"].T).reshape(T, H, d))
        k = np.repeat(rope((h @ p["wk"].T).reshape(T, KV, d)), H // KV, axis=1)
        v = np.repeat((h @ p["wv"].T).reshape(T, KV, d), H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d) + causal
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(T, H * d) @ p["wo"].T
        h = rms(x, p["ffn_norm"])
        gate = h @ p["w_gate"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p["w_up"].T)) @ p["w_down"].T
    return rms(x[-1], W["final_norm"]) @ W["lm_head"].T


def test_reference_matches_a_plain_numpy_forward():
    g = build_decoder(TINY, "prefill", 1, 12)
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, 12)
    ref = execute(g, "reference", seed=1, inputs=host_inputs(g, tokens))
    expect = _plain_forward(TINY, random_weights(g, seed=1), tokens)
    np.testing.assert_allclose(ref.outputs["logits"][0], expect, rtol=1e-4, atol=1e-4)


def test_ragged_batches_match_sequences_alone():
    rng = np.random.default_rng(5)
    # prefill: a short prompt padded in a batch gives what it gives alone
    g = build_decoder(TINY, "prefill", 2, [16, 11])
    tokens = rng.integers(0, TINY.vocab_size, (2, 16))
    both = execute(g, "reference", inputs=host_inputs(g, tokens))
    g1 = build_decoder(TINY, "prefill", 1, 11)
    alone = execute(g1, "reference", inputs=host_inputs(g1, tokens[1:, :11]))
    np.testing.assert_allclose(both.outputs["logits"][1], alone.outputs["logits"][0], rtol=1e-4, atol=1e-4)
    # decode: a sequence of 7 in a batch padded to 10 gives what it gives alone
    g = build_decoder(TINY, "decode", 2, [10, 7])
    ex = execute(g, "reference", seed=2, keep=True)
    g1 = build_decoder(TINY, "decode", 1, 7)
    kv = {k: v[1:, :, :7] for k, v in execute(g, "reference", seed=2).kv.items()}
    kv = {k: np.where(np.arange(7)[None, None, :, None] < 6, v, 0) for k, v in kv.items()}  # the cache before
    alone = execute(g1, "reference", seed=2, kv=kv, inputs={"tokens": ex.values["tokens"][1:]})
    np.testing.assert_allclose(ex.outputs["logits"][1], alone.outputs["logits"][0], rtol=1e-4, atol=1e-4)


def test_prefill_then_decode_equals_a_longer_prefill():
    """Prefill P tokens, then decode token P+1 from the cache: the logits are those of
    prefilling all P+1 tokens (RoPE positions, cache writes and masks agree)."""
    P = 9
    tokens = np.random.default_rng(7).integers(0, TINY.vocab_size, P + 1)
    pre = build_decoder(TINY, "prefill", 1, P)
    cache = execute(pre, "reference", inputs=host_inputs(pre, tokens[:P])).kv
    dec = build_decoder(TINY, "decode", 1, P + 1)
    kv = {k: np.concatenate([v, np.zeros((1, TINY.kv_heads, 1, TINY.head_dim), np.float32)], axis=2)
          for k, v in cache.items()}
    step = execute(dec, "reference", kv=kv, inputs=host_inputs(dec, tokens[P:]))
    full = build_decoder(TINY, "prefill", 1, P + 1)
    whole = execute(full, "reference", inputs=host_inputs(full, tokens))
    # the decode step starts from the cache as the device stores it (fp16), hence the tolerance
    np.testing.assert_allclose(step.outputs["logits"], whole.outputs["logits"], rtol=2e-3, atol=2e-3)
    assert np.array_equal(step.outputs["next_tokens"], whole.outputs["next_tokens"])
    for k in whole.kv:
        np.testing.assert_allclose(step.kv[k], whole.kv[k], rtol=2e-3, atol=2e-3)


def test_fp16_overflow_is_flagged():
    g = build_decoder(TINY, "decode", 1, 16)
    w = random_weights(g)
    w["L0.wq"] = w["L0.wq"] * 5000.0  # queries ~5000 (fit fp16), Q K^T scores ~5000 x 8: past 65504
    dev = execute(g, "device", weights=w)
    ref = execute(g, "reference", weights=w)
    assert "L0.q" not in dev.overflow and dev.overflow[0] == "L0.scores"
    assert "L0.scores" in ref.overflow  # the reference computes it, and says fp16 would not hold it
    assert ref.max_abs["L0.scores"] > 65504
    assert np.isnan(dev.outputs["logits"]).any() or cosine(dev.outputs["logits"], ref.outputs["logits"]) < 0.999


def test_bad_mode_and_missing_semantics():
    g = build_decoder(TINY, "decode", 1, 4)
    with pytest.raises(ValueError, match="mode must be one of device, reference"):
        execute(g, "fp8")
    # every registered op has a reference (test_ops_registry); an operand the node does not bind is named
    top = Node("top", "top_k", {"shape": (1, 1000), "k": 4}, {"logits": "logits"}, {"token": "next_tokens"})
    broken = Graph(g.tensors, list(g.nodes[:-1]) + [top], g.inputs, g.outputs, g.phase, g.batch, g.lengths,
                   g.workload)
    with pytest.raises(GraphError, match=r"node 'top' \(top_k\): no operand 'noise'"):
        execute(broken)
