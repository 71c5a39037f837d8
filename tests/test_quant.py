"""The quantize pass, its ops and what INT8 weights do to memory: the graph it makes,
the executor's INT8 values, the matmul variants' programs (hypothesis) and capacity."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.errors import ConfigError, ProgramError
from npusim.graph.build import build_decoder
from npusim.graph.execute import cosine, execute
from npusim.hw import load_hw
from npusim.isa.verify import verify
from npusim.ops import lower
from npusim.ops.quant import reference_quantize, QuantizeParams
from npusim.passes import PIPELINES, apply
from npusim.runtime.decoder import run_decoder
from npusim.runtime.memory import OutOfMemoryError, place

HW = load_hw("ascend910b2")


@pytest.fixture(scope="module")
def tiny():
    return build_decoder("k3-tiny", "decode", 2, 64)


def _linear(g):
    return [n for n in g.nodes if n.op_type == "matmul" and n.args.trans_b and g.tensors[n.inputs["b"]].kind == "weight"]


def test_optimized_does_not_quantize():
    assert "quantize" not in PIPELINES["optimized"]


def test_w8a16_quantizes_every_linear_but_the_head(tiny):
    g = apply(tiny, "optimized,quantize")
    linear = _linear(g)
    head = [n for n in linear if set(n.outputs.values()) & set(g.outputs)]
    assert len(head) == 1 and head[0].args.weight_dtype == ""
    body = [n for n in linear if n not in head]
    assert len(body) == 2 * 4  # qkv, o, gate_up, down per layer
    for n in body:
        assert n.args.weight_dtype == "int8" and g.tensors[n.inputs["b"]].dtype == "int8"
        assert g.tensors[n.inputs["scale"]].shape == (n.args.n,) and g.tensors[n.inputs["scale"]].dtype == "fp32"
    assert "quantize_per_token" not in g.count_by_type()


def test_layer_choices(tiny):
    everything = apply(tiny, "optimized,quantize", quant_layers="all")
    assert all(n.args.weight_dtype == "int8" for n in _linear(everything))
    some = apply(tiny, "optimized,quantize", quant_layers="o_proj,L1.down_proj,lm_head")
    picked = sorted(n.name for n in _linear(some) if n.args.weight_dtype == "int8")
    assert picked == ["L0.o_proj", "L1.down_proj", "L1.o_proj", "lm_head"]


def test_w8a8_quantizes_each_activation_once(tiny):
    g = apply(tiny, "quantize", quant="w8a8")  # unfused: q, k and v read one normed activation
    quants = [n for n in g.nodes if n.op_type == "quantize_per_token"]
    assert len(quants) == 4 * 2  # attn norm, attention output, ffn norm, ffn activation; per layer
    assert len({n.inputs["x"] for n in quants}) == len(quants)
    for n in _linear(g)[:-1]:
        assert n.args.dtype == "int8" and n.args.out_dtype == "fp32"
        assert g.producer(n.inputs["a"]).op_type == "quantize_per_token"
        for acc in n.outputs.values():
            assert [r.op_type for r in g.consumers(acc)] == ["token_dequant"]
    # every original output is still written, by its dequant, in the model dtype
    for name in ("L0.q", "L0.k", "L0.v", "L1.down"):
        assert g.producer(name).op_type == "token_dequant" and g.tensors[name].dtype == "fp16"


def test_quantize_options_errors(tiny):
    with pytest.raises(ConfigError, match="--quant: expected one of w8a16, w8a8"):
        apply(tiny, "quantize", quant="int4")
    with pytest.raises(ConfigError, match="--smooth-alpha: SmoothQuant"):
        apply(tiny, "quantize", smooth_alpha=0.5)


def test_executor_stores_integers_and_the_reference_run_is_fp32(tiny):
    """Device: weights and activations are int8 integers with scales; reference: the
    same graph unrounded computes what the FP graph computes."""
    g = apply(tiny, "optimized,quantize", quant="w8a8", smooth_alpha=0.5)
    dev = execute(g, "device", keep=True).values
    for n in _linear(g)[:-1]:
        for t in (n.inputs["a"], n.inputs["b"]):
            v = dev[t]
            assert np.array_equal(v, np.rint(v)) and np.abs(v).max() <= 127, t
        assert np.abs(dev[n.inputs["b"]]).max() == 127  # the per-channel scale puts each row's max at 127
    ref_q = execute(g, "reference").outputs["logits"]
    ref_fp = execute(tiny, "reference").outputs["logits"]
    assert cosine(ref_q, ref_fp) > 0.999999
    assert cosine(execute(g, "device").outputs["logits"], ref_fp) < cosine(ref_q, ref_fp)


def test_quantize_reference_round_trip():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[2] = 0.0  # a zero row: a finite scale
    p = QuantizeParams(rows=5, hidden=64)
    out = reference_quantize(p, {"x": x}, {}, None)
    np.testing.assert_allclose(out["scale"][[0, 1, 3, 4]], np.abs(x).max(axis=1)[[0, 1, 3, 4]] / 127, rtol=1e-6)
    assert np.isfinite(out["scale"]).all() and np.abs(out["y"]).max() <= 127 + 1e-4
    q = np.rint(out["y"])
    assert np.abs(q * out["scale"][:, None] - x).max() <= out["scale"].max() / 2 + 1e-7


# ---------------------------------------------------------------- every matmul variant verifies

VARIANTS = {
    "fp16": {},
    "bias": dict(bias=True),
    "w8a16": dict(weight_dtype="int8"),
    "w8a16+bias": dict(weight_dtype="int8", bias=True),
    "w8a8": dict(dtype="int8", out_dtype="fp32"),
}
SIZES = (1, 3, 8, 16, 17, 31, 32, 33, 48, 100, 255, 256, 257, 1000, 4096)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.sampled_from(sorted(VARIANTS)), m=st.sampled_from(SIZES), n=st.sampled_from(SIZES),
       k=st.sampled_from(SIZES), fmt=st.sampled_from(("ND", "NZ")), parts=st.booleans())
def test_every_matmul_variant_verifies(variant, m, n, k, fmt, parts):
    """Bias, W8A16, W8A8, N tails (n not a multiple of the tile or the fractal), split
    outputs: each kernel passes verify() (no GM read past a tensor, tiles fit, flags balance)."""
    params = dict(m=m, n=n, k=k, trans_b=True, format_b=fmt, **VARIANTS[variant])
    if parts and n >= 3:
        params["n_parts"] = (n // 3, n // 3, n - 2 * (n // 3))
    try:
        low = lower("matmul", params, HW)
    except (ProgramError, ConfigError) as e:
        pytest.fail(f"{params}: refused: {e}")
    for kern in low.kernels:
        verify(kern, HW)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.sampled_from((1, 2, 7, 8, 33, 512)), cols=st.sampled_from((16, 1000, 4096, 16896, 37891, 64000)),
       bias=st.booleans(), dtype=st.sampled_from(("fp16", "bf16")))
def test_token_dequant_verifies_at_any_width(rows, cols, bias, dtype):
    """Rows that fit UB stream whole; wider ones (an LM head, a wide FFN) in column chunks."""
    for kern in lower("token_dequant", dict(rows=rows, cols=cols, bias=bias, dtype=dtype), HW).kernels:
        verify(kern, HW)


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.sampled_from((1, 2, 7, 8, 33, 512)), hidden=st.sampled_from((32, 256, 4096, 8448, 18944)),
       smooth=st.booleans(), dtype=st.sampled_from(("fp16", "bf16")))
def test_quantize_verifies_or_names_the_row(rows, hidden, smooth, dtype):
    try:
        kernels = lower("quantize_per_token", dict(rows=rows, hidden=hidden, smooth=smooth, dtype=dtype), HW).kernels
    except ProgramError as e:  # only a row too long for UB is refused, by name
        assert hidden * (9 + 4 * smooth) > HW.aiv.ub_bytes // 2 and f"hidden={hidden} is too long" in str(e)
        return
    for kern in kernels:
        verify(kern, HW)


def test_w8a16_bias_reads_inside_the_bias_on_its_last_n_tile():
    """The fault the issue named: a W8A16 matmul with bias whose last N tile is partial."""
    low = lower("matmul", dict(m=8, n=1000, k=256, trans_b=True, format_b="NZ", weight_dtype="int8", bias=True), HW)
    for kern in low.kernels:
        verify(kern, HW)


def test_int8_cube_runs_at_its_own_fractal():
    """W8A8's Mmads are int8 and cost the int8 fractal (16x32x16: twice fp16's MACs per
    cycle, from the config): the same shape's cube cycles halve, start-ups aside."""
    from npusim.engine.compile import lower as lower_instr
    from npusim.isa.program import CoreType

    def cube(**kw):
        low = lower("matmul", dict(m=512, n=512, k=512, trans_b=True, **kw), HW)
        mmads = [i for kern in low.kernels for prog in kern.aic for i in _walk(prog.body) if type(i).__name__ == "Mmad"]
        return mmads, sum(lower_instr(i, CoreType.AIC, HW)[0][1].cost - HW.aic.mmad_startup_cycles for i in mmads)

    f16, f8 = HW.aic.mmad_fractals["fp16"], HW.aic.mmad_fractals["int8"]
    assert f8.m0 * f8.n0 * f8.k0 == 2 * f16.m0 * f16.n0 * f16.k0
    m16, c16 = cube()
    m8, c8 = cube(dtype="int8", out_dtype="fp32")
    assert {i.dtype for i in m16} == {"fp16"} and {i.dtype for i in m8} == {"int8"}
    assert c8 == c16 / 2


def _walk(body):
    """Instructions of a program body, loops unrolled."""
    for i in body:
        if type(i).__name__ == "Loop":
            yield from (x for _ in range(i.count) for x in _walk(i.body))
        else:
            yield i


# ---------------------------------------------------------------- memory and capacity


def test_int8_weights_shrink_the_weight_region():
    g = build_decoder("k3", "decode", 1, 128)
    fp = place(apply(g, "optimized"), HW.hbm.hbm_bytes).breakdown.weights_bytes
    q = place(apply(g, "optimized,quantize"), HW.hbm.hbm_bytes).breakdown.weights_bytes
    # the quantised Linear layers at 1 byte + 4 bytes of scale per output channel; embedding and head stay fp16
    w = g.workload
    layer = w.hidden_size * (w.q_size + 2 * w.kv_size) + w.q_size * w.hidden_size + 3 * w.hidden_size * w.ffn_size
    assert fp - q == pytest.approx(w.layers * layer, rel=0.01)


def _largest_batch(passes: str) -> int:
    with pytest.raises(OutOfMemoryError) as e:
        run_decoder("k3", "ascend910b2", "decode", 32, 8192, passes)
    return int(re.search(r"the largest batch that fits at context 8192 is (\d+)", str(e.value)).group(1))


def test_largest_batch_at_8192_grows_with_int8_weights():
    fp, q = _largest_batch("optimized"), _largest_batch("optimized,quantize")
    assert q > fp
    # and it does fit: the largest batch of each runs out of memory one sequence later
    with pytest.raises(OutOfMemoryError):
        run_decoder("k3", "ascend910b2", "decode", fp + 1, 8192, "optimized")


# ---------------------------------------------------------------- every shipped workload quantised


@pytest.mark.parametrize("phase, quant", [("decode", "w8a16"), ("decode", "w8a8"), ("prefill", "w8a8")])
@pytest.mark.parametrize("workload", ("k3", "k3-tiny", "llama2-7b", "qwen2.5-7b"))
def test_shipped_workloads_run_quantized(workload, quant, phase):
    """One decoder layer at the model's widths (the ops' shapes), every Linear layer
    quantised: each kernel lowers, verifies and runs; the weights shrink."""
    import attrs

    from npusim.workload import load_workload

    one = attrs.evolve(load_workload(workload), layers=1)
    fp = run_decoder(one, "ascend910b2", phase, 2, 16 if phase == "decode" else 8, "optimized")
    q = run_decoder(one, "ascend910b2", phase, 2, 16 if phase == "decode" else 8, "optimized,quantize",
                    quant=quant, quant_layers="all")
    assert q.result.cycles > 0 and q.memory.weights_bytes < fp.memory.weights_bytes


def test_compare_shows_weights_and_the_numpy_check_side_by_side():
    from npusim.report.step import comparison_table
    from npusim.runtime.decoder import compare

    c = compare("k3-tiny-outliers", "ascend910b2", "decode", 2, 64, ["optimized", "optimized,quantize"], quant="w8a8")
    table = comparison_table(c)
    header = next(line for line in table.splitlines() if "optimized,quantize" in line)
    assert header.split() == ["optimized", "optimized,quantize"]
    rows = {line[:24].strip(): line[24:].split() for line in table.splitlines() if line.startswith("  ")}
    fp, q = (float(v) for v in rows["weight bytes (GB)"])
    assert q < fp
    assert rows["logits cosine vs FP32"][1] == "ok" and rows["logits cosine vs FP32"][3] == "FAIL"
    assert float(rows["logits cosine vs FP32"][2]) < 0.999 <= float(rows["logits cosine vs FP32"][0])
    assert "HBM bytes (GB)" in rows and "latency (us)" in rows
