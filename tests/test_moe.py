"""Mixture-of-experts decoders: the workloads and their Hugging Face configs, the MoE
ops (numpy references, kernels that verify), the routing draw, validate's dense
reference (and a planted wrong permutation failing it), decode weight bytes
following the routing, and bad MoE input as one clear line."""

import json
import re

import attrs
import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.graph.routing import draw_routing
from npusim.hw import load_hw
from npusim.ops import lower, simulate_op
from npusim.ops import registry
from npusim.ops.moe import MoeGatingParams, dense_moe, gating, permutation
from npusim.ops.reference import RefContext
from npusim.passes.validate import validate_passes
from npusim.report.step import floor_weight_bytes
from npusim.runtime.decoder import run_decoder
from npusim.workload import load_workload

HW = load_hw("ascend910b2")
CTX = RefContext((1,), "decode", lambda x, dtype: np.asarray(x, dtype=np.float32))

# Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1 config.json, the keys npusim reads
QWEN3_MOE_HF = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}
MIXTRAL_HF = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 32000,
}


def _hf(tmp_path, data, name):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(data))
    return d / "config.json"


# ---- workloads


@pytest.mark.parametrize("name, hf", [("qwen3-30b-a3b", QWEN3_MOE_HF), ("mixtral-8x7b", MIXTRAL_HF)])
def test_shipped_workload_is_its_hf_config(tmp_path, name, hf):
    shipped = load_workload(name)
    assert attrs.evolve(load_workload(_hf(tmp_path, hf, name)), name=name) == shipped


def test_moe_parameter_counts_match_the_published_ones():
    """Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active; Mixtral 8x7B: 46.7 B, 12.9 B active."""
    q, m = load_workload("qwen3-30b-a3b"), load_workload("mixtral-8x7b")
    assert q.param_count / 1e9 == pytest.approx(30.5, abs=0.05)
    assert q.active_param_count / 1e9 == pytest.approx(3.3, abs=0.1)  # 3.35 B with the embedding and LM head
    assert m.param_count / 1e9 == pytest.approx(46.7, abs=0.05)
    assert m.active_param_count / 1e9 == pytest.approx(12.9, abs=0.05)


def test_first_dense_layers_keep_the_dense_ffn():
    w = load_workload("k3-tiny-moe")
    assert "w_gate" in w.layer_weight_shapes(0) and "w_gate_experts" in w.layer_weight_shapes(1)
    g = build_decoder(w, "decode", 2, 32)
    assert [n.layer for n in g.nodes if n.op_type == "moe_gating"] == [1]


# ---- ops


@pytest.mark.parametrize("scoring, norm", [("softmax", True), ("softmax", False), ("sigmoid", True)])
def test_gating_keeps_the_k_best_scores(scoring, norm):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 8)).astype(np.float32)
    w, ids = gating(MoeGatingParams(tokens=5, experts=8, k=3, scoring=scoring, norm_topk=norm), logits)
    scores = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True) if scoring == "softmax" else 1 / (
        1 + np.exp(-logits))
    for t in range(5):
        best = sorted(range(8), key=lambda e: -scores[t, e])[:3]
        assert list(ids[t]) == best
        want = scores[t, best] / (scores[t, best].sum() if norm else 1)
        np.testing.assert_allclose(w[t], want, rtol=1e-6)


def test_permute_then_combine_is_the_dense_mixture():
    """init routing -> a per-expert map of the rows -> finalize equals sum_j w_tj f_e(x_t)."""
    rng = np.random.default_rng(1)
    tokens, h, k, e = 6, 8, 2, 4
    x = rng.standard_normal((tokens, h)).astype(np.float32)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(tokens)])
    w = rng.random((tokens, k)).astype(np.float32)
    scale = np.arange(1, e + 1, dtype=np.float32)  # "expert" e multiplies its rows by e + 1
    init = registry.spec("moe_init_routing")
    out = init.reference(init.params(tokens=tokens, hidden=h, k=k, experts=e), {"x": x, "ids": ids}, {}, CTX)
    groups = out["group_list"]
    assert list(groups) == list(np.bincount(ids.ravel(), minlength=e))
    rows = out["y"] * np.repeat(scale, groups)[:, None]  # rows are in expert order
    fin = registry.spec("moe_finalize_routing")
    y = fin.reference(fin.params(tokens=tokens, hidden=h, k=k, residual=True),
                      {"x": rows, "row_map": out["row_map"], "weights": w, "residual": x}, {}, CTX)["y"]
    want = x + np.einsum("tk,tk,th->th", w, scale[ids], x)
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_permutation_is_stable_by_expert():
    row_map, groups = permutation(np.array([[2, 0], [0, 1]]), 3)
    assert list(groups) == [2, 1, 1] and list(row_map) == [3, 0, 1, 2]


@pytest.mark.parametrize("op, params", [
    ("moe_gating", dict(tokens=3, experts=8, k=2, dtype="fp16")),
    ("moe_gating", dict(tokens=40, experts=60, k=4, dtype="bf16", scoring="sigmoid", norm_topk=False)),
    ("moe_init_routing", dict(tokens=3, hidden=256, k=2, experts=8, dtype="fp16")),
    ("moe_init_routing", dict(tokens=100, hidden=512, k=8, experts=64, dtype="bf16")),
    ("moe_init_routing", dict(tokens=1000, hidden=256, k=2, experts=8, dtype="fp16")),  # more rows per core than experts
    ("moe_finalize_routing", dict(tokens=3, hidden=256, k=2, dtype="fp16", residual=True, shared=True)),
    ("moe_finalize_routing", dict(tokens=100, hidden=512, k=8, dtype="bf16")),
    ("moe_finalize_routing", dict(tokens=1000, hidden=256, k=2, dtype="fp16", residual=True)),
])
def test_moe_kernels_verify_and_run(op, params):
    r = simulate_op(lower(op, params, HW), HW, trace="kernel")  # verify() runs on every kernel
    assert r.cycles > 0


def test_top_k_above_experts_is_refused_by_the_op():
    with pytest.raises(ConfigError, match=r"'k' \(experts per token\) 9 is more than 'experts' 8"):
        lower("moe_gating", dict(tokens=1, experts=8, k=9), HW)


# ---- routing draw


def test_routing_draws_are_seeded_and_prefix_stable():
    w = load_workload("qwen3-30b-a3b")
    a, b = draw_routing(w, 3, 16), draw_routing(w, 3, 16)
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(draw_routing(w, 3, 4).ids, a.ids[:4])  # a batch's first tokens route as a smaller one
    assert not np.array_equal(draw_routing(w, 4, 16).ids, a.ids)
    assert all(len(set(row)) == w.experts_per_token for row in a.ids)


def test_zipf_routing_concentrates_rows():
    w = load_workload("qwen3-30b-a3b")
    z = attrs.evolve(w, routing="zipf", routing_zipf_exponent=1.2)
    uniform, skewed = draw_routing(w, 0, 512), draw_routing(z, 0, 512)
    assert skewed.busiest_share > 2 * uniform.busiest_share
    few = [sum(1 for c in draw_routing(x, 0, 8).tokens_per_expert if c) for x in (w, z)]
    assert few[1] < few[0]  # a decode batch's rows land on fewer experts


def test_zipf_decode_reads_fewer_expert_weights_on_one_card():
    """On one card a skewed routing concentrates a decode batch's rows on fewer experts: less
    weight traffic. (The busiest expert does not set the time here: a grouped matmul deals
    every expert's tiles over all cores; with expert parallelism the busiest card would.)"""
    w = load_workload("k3-tiny-moe", {"experts": 32})
    z = attrs.evolve(w, routing="zipf", routing_zipf_exponent=1.2)
    uniform, skewed = (floor_weight_bytes(build_decoder(x, "decode", 8, 32)) for x in (w, z))
    assert skewed < uniform


def test_trace_routing_is_read_per_layer(tmp_path):
    trace = tmp_path / "trace.yaml"
    trace.write_text("- [[0, 1], [2, 3]]\n")  # k3-tiny-moe: one MoE layer, 2 of 8 experts
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace)})
    r = draw_routing(w, 1, 3)  # a third token reuses the first's
    assert r.ids.tolist() == [[0, 1], [2, 3], [0, 1]] and r.tokens_per_expert == (2, 2, 1, 1, 0, 0, 0, 0)


def test_a_relative_trace_in_a_workload_file_is_the_files_neighbour(tmp_path, monkeypatch):
    """It was read from the working folder: another trace of the same name there was used
    silently (as hw's `base:`, a relative path is the file's folder's)."""
    from npusim.hw.load import find_file

    (tmp_path / "model").mkdir()
    text = find_file("k3-tiny-moe", "workloads").read_text()
    (tmp_path / "model" / "w.yaml").write_text(text + "routing: trace\nrouting_trace: trace.yaml\n")
    (tmp_path / "model" / "trace.yaml").write_text("- [[0, 1], [2, 3]]\n")
    (tmp_path / "trace.yaml").write_text("- [[7, 6]]\n")  # the working folder's
    monkeypatch.chdir(tmp_path)
    w = load_workload("model/w.yaml")
    assert draw_routing(w, 1, 2).ids.tolist() == [[0, 1], [2, 3]]
    assert load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": "trace.yaml"}).routing_trace \
        == "trace.yaml"  # given on the command line: the working folder's


# ---- validate: the dense reference


def test_validate_moe_passes():
    report = validate_passes("k3-tiny-moe", "optimized", phase="decode", batch=3, context=32)
    assert report.passed and [i for i, _ in report.moe] == [1]
    assert report.moe[0][1] > 0.9999


def test_validate_fails_a_wrong_permutation(monkeypatch):
    """A permutation that sends each row to the next one's place (and combines through the
    same wrong map) still gives baseline and transformed the same numbers: only the dense
    reference catches it."""
    init = registry.spec("moe_init_routing")

    def wrong(p, x, specs, ctx):
        out = init.reference(p, x, specs, ctx)
        return out | {"row_map": np.roll(out["row_map"], 1)}

    monkeypatch.setitem(registry._REGISTERED, "moe_init_routing", attrs.evolve(init, reference=wrong))
    report = validate_passes("k3-tiny-moe", "optimized", phase="decode", batch=3, context=32)
    assert not report.passed and report.moe[0][1] < 0.999
    assert "FAIL" in report.table().splitlines()[-3] or "FAIL" in report.table()


def test_dense_moe_matches_a_token_loop():
    rng = np.random.default_rng(2)
    t, h, f, e, k = 3, 8, 4, 4, 2
    norm = rng.standard_normal((t, h)).astype(np.float32)
    router = rng.standard_normal((e, h)).astype(np.float32)
    wg, wu = (rng.standard_normal((e, f, h)).astype(np.float32) for _ in range(2))
    wd = rng.standard_normal((e, h, f)).astype(np.float32)
    p = MoeGatingParams(tokens=t, experts=e, k=k)
    got = dense_moe(norm, router, (wg, wu, wd), p)
    w, ids = gating(p, norm @ router.T)
    for i in range(t):
        want = sum(w[i, j] * ((lambda g, u: g / (1 + np.exp(-g)) * u)(wg[ids[i, j]] @ norm[i], wu[ids[i, j]] @ norm[i])
                              @ wd[ids[i, j]].T) for j in range(k))
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)


# ---- weight bytes follow the routing


def test_decode_weight_bytes_grow_with_the_experts_routed_to():
    """k3-tiny-moe with 32 experts: more sequences route to more distinct experts, and the
    HBM bytes the step reads grow by about those experts' weights; a large batch reads
    every expert."""
    w = load_workload("k3-tiny-moe", {"experts": 32})
    per_expert = 3 * w.hidden_size * w.expert_ffn_size * w.dtype_bytes
    seen = []
    for batch in (1, 2, 4, 8, 64):
        used = sum(1 for c in draw_routing(w, 1, batch).tokens_per_expert if c)
        run = run_decoder(w, HW, "decode", batch, 32, memo=False)
        seen.append((used, run.result.stats.hbm_read_bytes, floor_weight_bytes(run.graph)))
    for (u0, r0, f0), (u1, r1, f1) in zip(seen, seen[1:]):
        assert u1 > u0 and r1 > r0
        assert f1 - f0 == (u1 - u0) * per_expert
        assert r1 - r0 >= 0.9 * (u1 - u0) * per_expert  # the engine reads them (and a little more activation)
    assert seen[-1][0] == w.experts  # every expert at batch 64


# ---- bad input: one line naming the key or file


def _yaml(tmp_path, **changes):
    text = (load_workload.__globals__["find_file"]("k3-tiny-moe", "workloads")).read_text()
    for key, value in changes.items():
        text = re.sub(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M)
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("changes, expect", [
    (dict(experts_per_token=9), r"bad.yaml: key 'experts_per_token': top-k 9 is more than the experts 8"),
    (dict(experts=0), r"key 'experts': expected a value > 0 for a MoE FFN"),
    (dict(mlp="swiglu"), r"key 'experts': set for a dense FFN \(mlp: swiglu\)"),
    (dict(router_scoring="relu"), r"key 'router_scoring': expected one of softmax, sigmoid, got 'relu'"),
    (dict(first_dense_layers=3), r"key 'first_dense_layers': expected 0 .. layers 2, got 3"),
])
def test_bad_moe_yaml_is_one_line(tmp_path, changes, expect):
    with pytest.raises(ConfigError, match=expect) as e:
        load_workload(_yaml(tmp_path, **changes))
    assert "\n" not in str(e.value)


def test_bad_moe_hf_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'num_experts_per_tok': top-k 9 is more than the "
                                          r"num_local_experts 8"):
        load_workload(_hf(tmp_path, MIXTRAL_HF | {"num_experts_per_tok": 9}, "m"))
    with pytest.raises(ConfigError, match=r"key 'mlp_only_layers': expected the first layers"):
        load_workload(_hf(tmp_path, QWEN3_MOE_HF | {"mlp_only_layers": [5]}, "q"))
    with pytest.raises(ConfigError, match=r"not supported: decoder_sparse_step = 2"):
        load_workload(_hf(tmp_path, QWEN3_MOE_HF | {"decoder_sparse_step": 2}, "q2"))


def test_npy_routing_trace(tmp_path):
    trace = tmp_path / "trace.npy"
    np.save(trace, np.array([[[7, 6], [5, 4]]], dtype=np.int32))  # [MoE layers, tokens, k]
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace)})
    assert draw_routing(w, 1, 2).ids.tolist() == [[7, 6], [5, 4]]
    np.save(trace, np.zeros((1, 2), dtype=np.int32))
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace), "routing_seed": 1})
    with pytest.raises(ConfigError, match=r"trace.npy: expected an integer array \[MoE layers, tokens, 2\]"):
        draw_routing(w, 1, 2)


@pytest.mark.parametrize("text, expect", [
    ("- [[0, 8], [2, 3]]\n", r"trace.yaml: layer 0, token 0: expert id 8 out of range, expected 0 .. 7"),
    ("- [[0, 1, 2]]\n", r"trace.yaml: layer 0, token 0: expected a list of 2 expert ids"),
    ("- [[1, 1]]\n", r"trace.yaml: layer 0, token 0: expected 2 distinct expert ids"),
    ("- [[0, 1]]\n- [[0, 1]]\n", r"trace.yaml: 2 layers of routing, expected one per MoE layer of k3-tiny-moe \(1\)"),
])
def test_bad_routing_trace_is_one_line(tmp_path, text, expect):
    trace = tmp_path / "trace.yaml"
    trace.write_text(text)
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace)})
    with pytest.raises(ConfigError, match=expect) as e:
        build_decoder(w, "decode", 2, 16)
    assert "\n" not in str(e.value)


# ---- tensor parallelism: every expert's FFN split over the group


def test_tensor_parallel_moe_splits_every_expert_and_sums_once():
    """Under --tp 2 each device holds half of every expert's (and the shared experts')
    FFN columns, routes every token, and its combine's partial rows are all-reduced
    before the residual is added, once per MoE layer."""
    full, half = (build_decoder("k3-tiny-moe", "decode", 2, 16, tp=tp) for tp in (1, 2))
    for name, spec in full.tensors.items():
        if name.endswith(("_experts", "_shared")) and spec.kind == "weight":
            assert np.prod(half.tensors[name].shape) * 2 == np.prod(spec.shape), name
    w = load_workload("k3-tiny-moe")
    reduces = [n for n in half.nodes if n.op_type == "all_reduce"]
    assert len(reduces) == 2 * w.layers  # after the O projection and after each FFN (dense or MoE)
    assert [n.name for n in half.nodes if n.name.endswith("moe_all_reduce")] == [
        f"L{i}.moe_all_reduce" for i in range(w.layers) if w.is_moe_layer(i)]
    with pytest.raises(ConfigError, match=r"--tp 3 does not divide k3-tiny-moe's heads"):
        build_decoder("k3-tiny-moe", "decode", 2, 16, tp=3)
    odd = attrs.evolve(w, expert_ffn_size=w.expert_ffn_size + 1)
    with pytest.raises(ConfigError, match=rf"--tp 2 does not divide k3-tiny-moe's expert_ffn_size {odd.expert_ffn_size}"):
        build_decoder(odd, "decode", 2, 16, tp=2)


def test_expert_parallel_with_tensor_parallel_attention():
    """--ep 4 --tp 2: attention over two tensor-parallel groups of two devices (half the
    heads each), whole experts over all four (a quarter each, the shared ones whole);
    each device takes half its group's tokens through the MoE layer and the group
    all_gathers them; the plan is read back from the graph's collectives."""
    from npusim.parallel.plan import Plan, check_plan, device_weight_bytes, graph_plan

    w = load_workload("k3-tiny-moe")
    g = build_decoder(w, "decode", 8, 256, tp=2, ep=4)
    full = build_decoder(w, "decode", 8, 256)
    for name, spec in full.tensors.items():
        if spec.kind != "weight" or not name.startswith("L"):
            continue
        ratio = np.prod(spec.shape) // np.prod(g.tensors[name].shape)
        key = name.split(".", 1)[1]
        want = 4 if key.endswith("_experts") else 2 if key in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down") else 1
        assert ratio == want, name
    moe = [i for i in range(w.layers) if w.is_moe_layer(i)]
    nodes = {n.name: n for n in g.nodes}
    for i in moe:
        assert dict(nodes[f"L{i}.moe_init_routing"].params)["tokens"] == 4
        gather = nodes[f"L{i}.moe_all_gather"].params
        assert (gather["devices"], gather["elements"]) == (2, 8 * w.hidden_size)
        assert nodes[f"L{i}.moe_dispatched_all_to_all"].params["devices"] == 4
    assert graph_plan(g) == Plan(2, 1, ep=4) and Plan(2, 1, ep=4).world == 4
    assert device_weight_bytes(w, 2, 4) < device_weight_bytes(w, 1, 4)
    hw = load_hw("ascend910b2")
    with pytest.raises(ConfigError, match=r"^--tp 2 does not divide --ep 3: attention runs in tensor-parallel groups"):
        check_plan(Plan(2, 1, ep=3), attrs.evolve(w, experts=6), hw)
    with pytest.raises(ConfigError, match=r"^--devices 8 must equal --ep 4 = 4$"):
        check_plan(Plan(2, 1, devices=8, ep=4), w, hw)
    run = run_decoder(w, HW, "decode", 8, 256, "optimized", tp=2, ep=4, devices=4, memo=False)
    kinds = {n.op_type for n in run.graph.nodes}
    assert {"all_reduce", "all_gather", "all_to_all"} <= kinds and run.latency_us > 0


def test_tensor_parallel_moe_computes_what_one_device_does(monkeypatch):
    """The ranks' shards of each expert together give the unsharded logits; without the
    all_reduce of the combine's partial rows they do not."""
    from npusim.graph.blocks import Layer
    from npusim.parallel.numerics import check_sharded

    assert check_sharded("k3-tiny-moe", tp=2).passed
    reduce = Layer.all_reduce
    monkeypatch.setattr(Layer, "all_reduce", lambda s, name, x: x if name == "moe" else reduce(s, name, x))
    assert not check_sharded("k3-tiny-moe", tp=2).passed


# ---- expert parallelism


def test_ep_zipf_is_slower_than_uniform():
    """Over 4 devices the busiest one sets the step: a skewed routing sends it more rows (a
    larger share of the group's), so its expert GEMMs and its all-to-alls take longer."""
    from npusim.report.moe import moe_breakdown

    w = load_workload("k3-tiny-moe", {"experts": 32, "expert_ffn_size": 512})
    z = attrs.evolve(w, routing="zipf", routing_zipf_exponent=1.2)
    runs = [run_decoder(x, HW, "prefill", 1, 256, "optimized", ep=4, devices=4, memo=False) for x in (w, z)]
    (u, mu), (s, ms) = ((r, moe_breakdown(r)) for r in runs)
    assert max(ms["busiest_card_share"]) > max(mu["busiest_card_share"]) > 1 / 4
    assert ms["us"]["experts"] > mu["us"]["experts"] and ms["us"]["all_to_all"] > mu["us"]["all_to_all"] > 0
    assert s.latency_us > u.latency_us


def test_ep_device_holds_its_share_of_the_experts():
    from npusim.parallel.plan import device_weight_bytes

    w = load_workload("qwen3-30b-a3b")
    expert = 3 * w.hidden_size * w.expert_ffn_size * w.dtype_bytes
    assert device_weight_bytes(w, 1, 8) == w.weight_bytes - w.moe_layers * (w.experts - w.experts // 8) * expert
    g = build_decoder(w, "decode", 8, 64, ep=8)
    assert g.tensors["L0.w_gate_experts"].shape == (16, 768, 2048)
    assert sum(n.op_type == "all_to_all" for n in g.nodes) == 2 * w.moe_layers


def test_ep_not_dividing_the_experts_is_one_line():
    with pytest.raises(ConfigError, match=r"^--ep 3 does not divide k3-tiny-moe's experts 8 \(each device holds"):
        build_decoder("k3-tiny-moe", "decode", 2, 16, ep=3)
    with pytest.raises(ConfigError, match=r"--ep 2: k3-tiny has no experts to place"):
        build_decoder("k3-tiny", "decode", 2, 16, ep=2)
    with pytest.raises(ConfigError, match=r"--devices 4 must equal --ep 2 = 2"):
        run_decoder("k3-tiny-moe", HW, "decode", 2, 16, ep=2, devices=4)


def test_a_moe_too_big_for_one_device_is_told_the_tp_and_the_ep_that_fit():
    from npusim.runtime.memory import OutOfMemoryError

    with pytest.raises(OutOfMemoryError, match=r"weights 86.99 GiB .* fit on 2 devices \(--tp 2\) or with the experts "
                                               r"over 2 devices \(--ep 2\)$"):
        run_decoder("mixtral-8x7b", HW, "decode", 8, 2048)


def test_the_shared_experts_run_beside_the_dispatch():
    """The shared experts read only the FFN norm: built right after the permutation, the
    streams pass puts them on stream 1, so they run beside the dispatch all-to-all and
    are done before the routed experts start (not after the combine, on the step's path)."""
    run = run_decoder("k3-tiny-moe", HW, "decode", 4, 256, "optimized", ep=2, devices=2, memo=False)
    moe = run.graph.nodes[[n.op_type for n in run.graph.nodes].index("moe_init_routing"):]
    shared = [n.name for n in moe[1:[n.op_type for n in moe].index("all_to_all")]]  # between permute and dispatch
    assert len(shared) == 3 and all(run.graph.schedule.stream(name) == 1 for name in shared)
    mine = [k for k in run.result.kernels if k.owner and k.owner.node in shared]
    dispatch, experts = ([k for k in run.result.kernels if k.owner and k.owner.layer == 1 and k.op_type == t]
                         for t in ("all_to_all", "grouped_matmul"))
    assert max(k.end for k in mine) < min(k.start for k in experts)
    assert min(k.start for k in mine) < max(k.end for k in dispatch[:2])  # the dispatch's kernels


def test_compare_plans_takes_expert_parallel_plans():
    """`compare --plans tp1 ep2 tp2,ep4`: each plan's step, its devices and the tokens of
    every batch its devices run (an expert-parallel plan runs one per data-parallel group)."""
    from npusim.parallel.compare import compare_plans, plans_table

    c = compare_plans("k3-tiny-moe", HW, "decode", 8, 256, plans=["tp1", "ep2", "tp2,ep4"], memo=False)
    assert [(p.world, p.replicas) for p in c.plans.values()] == [(1, 1), (2, 2), (4, 2)]
    table = plans_table(c)
    row = next(line for line in table.splitlines() if line.strip().startswith("tokens/s"))
    want = [c.fitted[k].tokens_per_s * c.plans[k].replicas for k in c.plans]
    assert row.split()[1:] == [f"{x:,.1f}" for x in want]
    assert "one per data-parallel group" in table
