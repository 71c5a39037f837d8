"""The passes on k3-tiny: each changes what it should (direction asserted, magnitude
printed) and keeps the numbers right (numpy validation against FP32)."""

from __future__ import annotations

import attrs
import pytest

from npusim.errors import ConfigError
from npusim.graph import build_decoder
from npusim.graph.ir import Node
from npusim.hw import load_hw
from npusim.passes import PIPELINES, apply, fuse, pass_names
from npusim.passes.buckets import bucket_of, compiles_over, distinct_kernels, first_run_compile_us, padding
from npusim.passes.validate import validate, validate_passes
from npusim.runtime import run_graph
from npusim.workload import load_workload

HW = load_hw("ascend910b2")
TINY = load_workload("k3-tiny")
ORDER = PIPELINES["optimized"]


def _run(phase: str, passes, **options):
    lengths = 64 if phase == "decode" else 32
    return run_graph(apply(build_decoder(TINY, phase, 2, lengths), passes, **options), HW, memo=False)


@pytest.fixture(scope="module", params=["decode", "prefill"])
def steps(request):
    """phase, {pass: run with it and every earlier pass}, plus "baseline"."""
    phase = request.param
    runs = {"baseline": _run(phase, "baseline")}
    for i, name in enumerate(ORDER):
        runs[name] = _run(phase, ORDER[:i + 1])
    return phase, runs


def _before(runs: dict, name: str):
    i = ORDER.index(name)
    return runs[ORDER[i - 1]] if i else runs["baseline"]


def _kernels(r, op_type=None) -> int:
    return sum(1 for k in r.result.kernels if op_type is None or k.op_type == op_type)


def test_fusion_cuts_kernels_and_gm_bytes(steps):
    phase, runs = steps
    a, b = runs["baseline"], runs["fusion"]
    print(f"\n{phase} fusion: kernels {_kernels(a)} -> {_kernels(b)}, GM bytes {a.result.stats.gm_bytes:.0f} -> "
          f"{b.result.stats.gm_bytes:.0f}, latency {a.latency_us:.1f} -> {b.latency_us:.1f} us")
    assert _kernels(b) < _kernels(a)
    assert b.result.stats.gm_bytes < a.result.stats.gm_bytes
    types = b.graph.count_by_type()
    assert "softmax" not in types and "silu" not in types and types.get("add_rms_norm", 0) > 0


def test_layout_removes_trans_data(steps):
    phase, runs = steps
    a, b = _before(runs, "layout"), runs["layout"]

    def moving(r) -> float:
        return sum(k.cycles for k in r.result.kernels if k.op_type == "trans_data")

    print(f"\n{phase} layout: trans_data kernels {_kernels(a, 'trans_data')} -> {_kernels(b, 'trans_data')}, "
          f"their time {HW.us(moving(a)):.2f} -> {HW.us(moving(b)):.2f} us")
    assert _kernels(b, "trans_data") < _kernels(a, "trans_data")
    assert moving(b) < moving(a)
    assert b.latency_us < a.latency_us


def test_contiguous_kv_cuts_segments_and_waste(steps):
    phase, runs = steps
    a, b = _before(runs, "kv_layout"), runs["kv_layout"]

    def writes(r, what):
        return sum(getattr(k.stats, what) for k in r.result.kernels if k.op_type == "kv_cache_write")

    print(f"\n{phase} kv_layout (contiguous): cache-write segments {writes(a, 'dma_segments')} -> "
          f"{writes(b, 'dma_segments')}, wasted burst bytes {writes(a, 'wasted_burst_bytes'):.0f} -> "
          f"{writes(b, 'wasted_burst_bytes'):.0f}; all kernels: segments {a.result.stats.dma_segments} -> "
          f"{b.result.stats.dma_segments}")
    assert writes(b, "dma_segments") < writes(a, "dma_segments")
    assert writes(b, "wasted_burst_bytes") <= writes(a, "wasted_burst_bytes")
    # the readers: FlashAttention (prefill, and decode under k3-tiny's GQA) reads K and V
    # of the interleaved rows separately; the vector decode kernel's fewer segments are
    # test_ops_attention.test_paged_decode_reads_one_segment_per_block's


@pytest.mark.parametrize("name, host", [("sync", "host_wait_cycles"), ("launch", "host_launch_cycles")])
def test_host_passes_cut_their_host_time(steps, name, host):
    """sync: less host wait; launch (graph mode): less host launch time."""
    phase, runs = steps
    a, b = _before(runs, name), runs[name]
    print(f"\n{phase} {name}: {host} {HW.us(getattr(a.result, host)):.1f} -> {HW.us(getattr(b.result, host)):.1f} us, "
          f"latency {a.latency_us:.1f} -> {b.latency_us:.1f} us")
    assert getattr(b.result, host) < getattr(a.result, host)
    assert b.latency_us < a.latency_us


def test_second_stream_overlaps_side_work(steps):
    phase, runs = steps
    a, b = _before(runs, "streams"), runs["streams"]
    side = [k for k in b.result.kernels if k.stream == 1]
    print(f"\n{phase} streams: {len(side)} kernels on stream 1, latency {a.latency_us:.1f} -> {b.latency_us:.1f} us")
    assert side and b.latency_us < a.latency_us


def test_memory_plan_lowers_peak(steps):
    phase, runs = steps
    a, b = _before(runs, "memplan"), runs["memplan"]
    print(f"\n{phase} memplan: activations {a.memory.activation_bytes} -> {b.memory.activation_bytes} bytes, "
          f"peak {a.memory.total_bytes} -> {b.memory.total_bytes}")
    assert b.memory.activation_bytes < a.memory.activation_bytes
    assert b.memory.total_bytes < a.memory.total_bytes
    assert all(off % 64 == 0 for off in b.graph.memory_plan.offsets.values())
    unfused = apply(build_decoder(TINY, phase, 2, 32), "memplan").memory_plan
    assert ("L0.ffn_act", "L0.gate_act") in unfused.in_place  # mul writes over silu's output, which dies there


def test_memory_plan_never_overlaps_live_tensors():
    from npusim.passes.memplan import lifetimes

    for phase in ("decode", "prefill"):
        g = apply(build_decoder(TINY, phase, 2, 32), "optimized")
        life, plan = lifetimes(g), g.memory_plan
        shared = {out: src for out, src in plan.in_place}
        items = sorted(life)
        for i, t in enumerate(items):
            for u in items[i + 1:]:
                (a0, a1), (b0, b1) = life[t], life[u]
                if a1 < b0 or b1 < a0 or shared.get(t) == u or shared.get(u) == t:
                    continue
                lo_t, lo_u = plan.offsets[t], plan.offsets[u]
                assert lo_t + g.tensors[t].nbytes <= lo_u or lo_u + g.tensors[u].nbytes <= lo_t, (t, u)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("phase, lengths", [("decode", 64), ("decode", [64, 23]), ("prefill", [32, 20])])
@pytest.mark.parametrize("upto", range(len(ORDER)))
def test_every_pass_keeps_the_numbers(phase, lengths, upto):
    v = validate_passes(TINY, ORDER[:upto + 1], phase=phase, batch=2, context=lengths)
    print("\n" + v.table())
    assert v.passed


@pytest.mark.parametrize("kv_layout", ["paged"])
def test_paged_kv_keeps_the_numbers(kv_layout):
    v = validate_passes(TINY, "optimized", batch=2, context=[64, 23], kv_layout=kv_layout)
    assert v.passed


def _drop_attention_scale(g):
    """A broken 'fusion': removes the 1/sqrt(d) scale in front of the softmax."""
    nodes = []
    for n in g.nodes:
        if n.op_type == "scale":
            n = attrs.evolve(n, params=dict(n.params, scale=1.0))
        nodes.append(n)
    return attrs.evolve(g, nodes=nodes)


def _wrong_residual(g):
    """A broken 'fusion': the FFN residual adds the norm's output instead of its input."""
    nodes = []
    for n in g.nodes:
        if n.name.endswith("ffn_residual"):
            norm = next(m for m in g.nodes if m.name == n.name.replace("ffn_residual", "ffn_norm"))
            n = Node(n.name, n.op_type, n.params, dict(n.inputs, x1=norm.outputs["y"]), n.outputs, n.layer)
        nodes.append(n)
    return attrs.evolve(g, nodes=nodes)


@pytest.mark.parametrize("broken", [_drop_attention_scale, _wrong_residual])
def test_a_broken_transform_fails_validation(broken):
    v = validate(build_decoder(TINY, "decode", 2, 64), broken)
    print("\n" + v.table())
    assert not v.passed


def test_buckets_trade_padding_for_compiles():
    lengths = [300, 97]
    exact = apply(build_decoder(TINY, "decode", 2, lengths), "optimized")
    padded = apply(build_decoder(TINY, "decode", 2, lengths), "optimized,buckets")
    assert padded.applied[0] == "buckets" and padded.context == 512 and exact.context == 300
    a, b = run_graph(exact, HW, memo=False), run_graph(padded, HW, memo=False)
    trace = list(range(200, 500, 7))  # a sequence growing through 43 lengths
    print(f"\nbuckets: padding {padding(exact):.1%} -> {padding(padded):.1%}, latency {a.latency_us:.1f} -> "
          f"{b.latency_us:.1f} us; shapes compiled over {len(trace)} steps {compiles_over(trace, None)} -> "
          f"{compiles_over(trace)}, {first_run_compile_us(padded, HW) / 1e3:.0f} ms each "
          f"({distinct_kernels(padded)} kernels)")
    assert padding(padded) > padding(exact)
    # the padding is computed on: more FLOPs and bytes (the latency of this tiny model is its kernel
    # starts, within a few ns either way: a short last key step's masking against a full one's)
    assert b.result.stats.flops > a.result.stats.flops
    assert b.result.stats.gm_read_bytes > a.result.stats.gm_read_bytes
    assert compiles_over(trace) < compiles_over(trace, None)
    assert validate_passes(TINY, "optimized,buckets", batch=2, context=lengths).passed
    assert [bucket_of(n) for n in (1, 512, 513, 4096, 4097)] == [512, 512, 1024, 4096, 8192]
    assert bucket_of(500, margin=16) == 1024


def test_buckets_must_come_first():
    with pytest.raises(ConfigError, match="buckets: must be the first pass"):
        from npusim.passes.buckets import pad_to_bucket

        pad_to_bucket(fuse(build_decoder(TINY, "decode", 1, 8)))


# ---------------------------------------------------------------- options and errors


def test_fusion_rules_switch_off(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("flash_attention: off\nqkv_proj: off\n")
    g = fuse(build_decoder(TINY, "prefill", 1, 16), rules)
    types = g.count_by_type()
    assert "flash_attention" not in types and types["softmax"] == TINY.layers
    assert types.get("scale_add", 0) == TINY.layers  # the unfused chain's scale + mask add still fuse
    assert types.get("swiglu", 0) == TINY.layers
    assert validate(build_decoder(TINY, "prefill", 1, 16), lambda x: fuse(x, rules)).passed


@pytest.mark.parametrize("text, needle", [
    ("flash_attenton: off\n", "unknown fusion rule 'flash_attenton'"),
    ("swiglu: maybe\n", "rule 'swiglu' must be on or off"),
])
def test_bad_fusion_rules_file(tmp_path, text, needle):
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    with pytest.raises(ConfigError, match=needle) as e:
        fuse(build_decoder(TINY, "decode", 1, 8), rules)
    assert "\n" not in str(e.value) and str(rules) in str(e.value)


def test_pass_names_and_errors():
    assert pass_names("baseline") == ()
    assert pass_names("memplan,fusion") == ("fusion", "memplan")
    with pytest.raises(ConfigError, match="unknown pass or pipeline 'fusoin'"):
        pass_names("fusoin")
    g = apply(build_decoder(TINY, "decode", 1, 8), "kv_layout")  # unfused attention: per-layer caches stay
    assert g.applied[-1].startswith("kv_layout (skipped") and "L0.k_cache" in g.tensors


def test_fusion_rules_as_a_dict_are_checked_too():
    g = fuse(build_decoder(TINY, "decode", 1, 8), {"swiglu": False})
    assert "silu" in g.count_by_type() and "decode_attention" in g.count_by_type()
    with pytest.raises(ConfigError, match="unknown fusion rule 'flash_atention'"):
        fuse(build_decoder(TINY, "decode", 1, 8), {"flash_atention": False})
