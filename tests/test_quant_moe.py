"""INT8 weights (W8A16) on a MoE layer's experts: the quantize pass takes the grouped
matmuls (expert weights [E, n, k] with a scale per expert and channel), the numpy
check still passes, a decode step reads half the expert weight bytes, the grouped
matmul's W8A16 kernel reads each group's own expert (int8) and scale row, and W8A8
refuses a named expert GEMM in one line."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.hw import load_hw
from npusim.isa.program import Copy, Loop, Mem
from npusim.ops import OPS, lower, simulate_op
from npusim.ops.reference import RefContext
from npusim.passes import apply
from npusim.passes.validate import MIN_COSINE, validate_passes
from npusim.passes.validate_kernels import check_op
from npusim.runtime.decoder import run_decoder

HW = load_hw("ascend910b2")
MOE = "k3-tiny-moe"
CTX = RefContext((1,), "prefill", lambda x, dtype: np.asarray(x, dtype=np.float32))


@pytest.fixture(scope="module")
def moe():
    return build_decoder(MOE, "decode", 2, 64)


def _experts(g):
    return [n for n in g.nodes if n.op_type == "grouped_matmul"]


# ---------------------------------------------------------------- the pass


def test_w8a16_quantizes_the_experts_with_a_scale_per_expert_and_channel(moe):
    g = apply(moe, "optimized,quantize", quant="w8a16")
    experts = _experts(g)
    assert len(experts) == 3 * sum(1 for n in _experts(moe) if n.name.endswith("experts_gate_proj"))
    for n in experts:
        w, s = g.tensors[n.inputs["weight"]], g.tensors[n.inputs["scale"]]
        assert n.args.weight_dtype == "int8" and w.dtype == "int8"
        assert s.shape == (len(n.args.group_sizes), n.args.n) and s.dtype == "fp32" and s.kind == "weight"


def test_quant_layers_names_an_expert_gemm(moe):
    g = apply(moe, "optimized,quantize", quant_layers="experts_down_proj")
    picked = sorted(n.name.split(".", 1)[-1] for n in g.nodes if n.params.get("weight_dtype") == "int8")
    assert picked and set(picked) == {"experts_down_proj"}


def test_w8a16_keeps_the_logits_of_the_fp_graph():
    v = validate_passes(MOE, "optimized,quantize", quant="w8a16", quant_layers="all")
    logits = next(c for c in v.checks if c.name == "logits")
    print(f"\nk3-tiny-moe W8A16 (experts too): logits cosine {logits.transformed:.6f}")
    assert logits.transformed >= MIN_COSINE and v.passed


def test_decode_reads_half_the_expert_weight_bytes():
    """Only the experts are quantised: the step reads the used experts' int8 bytes (plus
    a scale per expert and channel) instead of fp16: half their bytes."""
    layers = "experts_gate_proj,experts_up_proj,experts_down_proj"
    fp = run_decoder(MOE, "ascend910b2", "decode", 2, 64, "optimized")
    q = run_decoder(MOE, "ascend910b2", "decode", 2, 64, "optimized,quantize", quant_layers=layers)
    experts = _experts(q.graph)
    assert experts and all(n.args.weight_dtype == "int8" for n in experts)
    # the bytes of the experts that have rows: the ones a decode step reads
    used = {n.name: sum(1 for r in n.args.group_sizes if r) for n in experts}
    int8_bytes = sum(n.args.k * n.args.n * used[n.name] for n in experts)
    scale_bytes = sum(n.args.n * 4 * used[n.name] for n in experts)
    saved = fp.result.stats.hbm_read_bytes - q.result.stats.hbm_read_bytes
    print(f"\nHBM reads: fp16 {fp.result.stats.hbm_read_bytes} B, int8 experts {q.result.stats.hbm_read_bytes} B, "
          f"used experts' int8 bytes {int8_bytes}, their scales {scale_bytes}")
    assert q.result.stats.hbm_read_bytes < fp.result.stats.hbm_read_bytes
    # fp16 -> int8 saves one byte per weight element read; each used expert's scale row is read instead
    assert saved == pytest.approx(int8_bytes - scale_bytes, rel=0.01)


# ---------------------------------------------------------------- the op


UNEVEN = dict(group_sizes=(20, 0, 37, 5), k=96, n=80, trans_b=True, weight_dtype="int8")


def test_reference_multiplies_the_integers_then_each_experts_scales():
    sizes, k, n = (3, 0, 5, 1), 6, 4
    rng = np.random.default_rng(2)
    x = rng.standard_normal((sum(sizes), k), np.float32)
    w = rng.integers(-127, 128, (len(sizes), n, k)).astype(np.float32)
    s = rng.uniform(0.01, 0.1, (len(sizes), n)).astype(np.float32)
    b = rng.standard_normal((len(sizes), n), np.float32)
    p = OPS["grouped_matmul"].params(group_sizes=sizes, k=k, n=n, trans_b=True, bias="fp32", weight_dtype="int8")
    y = OPS["grouped_matmul"].reference(p, {"x": x, "weight": w, "scale": s, "bias": b}, {}, CTX)["y"]
    expert = np.repeat(np.arange(len(sizes)), sizes)
    for i in range(sum(sizes)):
        g = expert[i]
        np.testing.assert_allclose(y[i], (x[i].astype(np.float64) @ w[g].T) * s[g] + b[g], rtol=1e-5, atol=1e-5)


def _gm_reads(body, env: dict):
    """Every GM copy in program order, loops unrolled: (reads GM, first byte, bytes per segment, segments, stride)."""
    for x in body:
        if isinstance(x, Loop):
            for i in range(x.count):
                yield from _gm_reads(x.body, {**env, x.var: i})
        elif isinstance(x, Copy) and Mem.GM in (x.src, x.dst):
            a, stride = (x.src_addr, x.src_stride) if x.src is Mem.GM else (x.dst_addr, x.dst_stride)
            yield x.src is Mem.GM, a if isinstance(a, int) else a.at(env), x.nbytes, x.segments, stride or x.nbytes


def test_each_tile_reads_its_experts_int8_weight_and_scale_row():
    """Uneven groups with an empty one: between two FixPipe writes (one tile), the int8
    weight and scale bytes read are all the tile's expert's; every used expert's weight
    and scale row are read, the empty expert's never; the weight is half the fp16 bytes."""
    sizes, k, n = UNEVEN["group_sizes"], UNEVEN["k"], UNEVEN["n"]
    low = lower("grouped_matmul", UNEVEN, HW, tiling=dict(base_m=16, base_n=32, base_k=32, step_k=1))
    fp16 = lower("grouped_matmul", {**UNEVEN, "weight_dtype": ""}, HW)
    kernel = low.kernels[0]
    gm = {t.name: t for t in kernel.gm}
    assert gm["weight"].nbytes * 2 == {t.name: t for t in fp16.kernels[0].gm}["weight"].nbytes == len(sizes) * k * n * 2
    assert gm["scale"].nbytes == len(sizes) * n * 4
    group_of_row = np.repeat(np.arange(len(sizes)), sizes)
    touched = {name: np.zeros(t.nbytes, int) for name, t in gm.items()}
    per_expert = {"weight": k * n, "scale": n * 4}
    for block, prog in enumerate(kernel.aic):
        seen: dict[str, set] = {"weight": set(), "scale": set()}
        for read, first, nbytes, segments, stride in _gm_reads(prog.body, {"block": block}):
            for a in (first + i * stride for i in range(segments)):
                name = next(t for t in gm if gm[t].addr <= a < gm[t].addr + gm[t].nbytes)
                off = a - gm[name].addr
                touched[name][off:off + nbytes] += 1
                if name in seen:
                    seen[name].add(off // per_expert[name])
                elif name == "y":
                    g = group_of_row[off // (n * 2)]
                    assert seen["weight"] <= {g} and seen["scale"] <= {g}
                    seen = {"weight": set(), "scale": set()}
    for g, rows in enumerate(sizes):
        for name, size in per_expert.items():
            part = touched[name][g * size:(g + 1) * size]
            assert (part >= 1).all() if rows else not part.any(), (name, g)
    assert low.min_gm_bytes < fp16.min_gm_bytes


@pytest.mark.xfail(strict=True, reason="the functional interpreter has no MTE1 int8 -> fp16 widening into L0B nor a "
                   "FixPipe dequant conversion (matmul's W8A16 is not checked either)")
def test_the_int8_kernel_matches_its_reference_in_the_interpreter():
    c = check_op("grouped_matmul", UNEVEN, HW)
    assert c.status == "pass", c.row()


def test_the_int8_kernel_verifies_and_never_beats_the_roofline():
    r = simulate_op(lower("grouped_matmul", UNEVEN, HW), HW, trace="kernel")  # runs verify()
    assert r.seconds >= r.roofline.time_s


# ---------------------------------------------------------------- bad combinations


def test_w8a8_refuses_a_named_expert_gemm_in_one_line(moe):
    with pytest.raises(ConfigError, match=r"--quant-layers: '.*experts_gate_proj' is a MoE expert GEMM") as e:
        apply(moe, "optimized,quantize", quant="w8a8", quant_layers="experts_gate_proj")
    assert "\n" not in str(e.value)


def test_w8a8_leaves_the_experts_in_fp16(moe):
    g = apply(moe, "optimized,quantize", quant="w8a8", quant_layers="all")
    assert all(n.args.weight_dtype == "" for n in _experts(g))
    assert any(n.op_type == "matmul" and n.args.dtype == "int8" for n in g.nodes)


def test_weight_dtype_other_than_int8_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"'weight_dtype' must be in") as e:
        lower("grouped_matmul", {**UNEVEN, "weight_dtype": "fp8"}, HW)
    assert "\n" not in str(e.value)
