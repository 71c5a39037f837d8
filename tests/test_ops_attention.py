"""Attention lowerings: FlashAttention (one MIX kernel), flash-decoding and the
unfused 5-kernel chain; the fused two reading a KV cache in each layout.

Every kernel passes verify() (simulate_op runs it) and no op beats its roofline;
FlashAttention against the chain at the decoder's prefill shape (S = 4096, 32
heads, head_dim 128, causal): faster, less GM traffic, far less HBM traffic and
memory; causal skips work; GQA reads less K/V from HBM; a tile that cannot fit
is a one-line error naming the buffer.
"""

from __future__ import annotations

import math

import pytest

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.isa import CoreType, Loop
from npusim.ops import lower, simulate_op

HW = load_hw("ascend910b2")


def run(op: str, **params):
    lowered = lower(op, params, HW)
    return lowered, simulate_op(lowered, HW, trace="kernel")


def memory_bytes(lowered) -> int:
    """Every GM tensor the op's kernels use (inputs, outputs, intermediates, workspace), once."""
    return sum({t.name: t.nbytes for k in lowered.kernels for t in k.gm}.values())


def hbm_bytes(report) -> float:
    return report.stats.hbm_read_bytes + report.stats.hbm_write_bytes


def attn(batch=1, heads=2, kv_heads=None, head_dim=64, seq_q=128, seq_kv=None, causal=False, dtype="fp16"):
    return dict(batch=batch, heads=heads, kv_heads=kv_heads or heads, head_dim=head_dim, seq_q=seq_q,
                seq_kv=seq_kv or seq_q, causal=causal, dtype=dtype)


GRID = [
    ("flash_attention", attn(heads=1, head_dim=16, seq_q=1)),  # one row: both AIVs share it
    ("flash_attention", attn(heads=2, seq_q=16, seq_kv=16, causal=True)),
    ("flash_attention", attn(heads=3, head_dim=128, seq_q=200, seq_kv=300, causal=True)),  # odd tails
    ("flash_attention", attn(batch=2, heads=4, kv_heads=2, head_dim=128, seq_q=512, causal=True)),  # GQA
    ("flash_attention", attn(heads=5, head_dim=96, seq_q=1000, dtype="bf16")),
    ("flash_attention", attn(heads=2, head_dim=256, seq_q=384, causal=True)),  # smaller tiles
    ("flash_attention", attn(heads=24, head_dim=128, seq_q=1024)),  # whole heads only: one shared program
    ("flash_attention", attn(heads=32, head_dim=128, seq_q=512, causal=True)),  # 24 whole + 8 split heads
    ("decode_attention", dict(batch=1, heads=4, kv_heads=4, head_dim=128, context=1)),
    ("decode_attention", dict(batch=2, heads=8, kv_heads=2, head_dim=64, context=1000)),
    ("decode_attention", dict(batch=4, heads=32, kv_heads=32, head_dim=128, context=512)),
    ("decode_attention", dict(batch=1, heads=32, kv_heads=32, head_dim=128, context=4096)),  # 3 splits, a tail
    ("attention_unfused", attn(heads=2, head_dim=64, seq_q=128, causal=True)),
    ("attention_unfused", attn(heads=4, kv_heads=2, head_dim=128, seq_q=320, seq_kv=512)),
]


@pytest.mark.parametrize("op, params", GRID, ids=lambda x: x if isinstance(x, str) else "-".join(
    f"{k}{v}" for k, v in x.items()))
def test_kernels_verify_and_stay_above_the_roofline(op, params):
    lowered, r = run(op, **params)
    assert r.seconds >= r.roofline.time_s
    assert r.stats.flops > 0
    ins = {t.name: t for t in lowered.inputs}
    k, v = ("k", "v") if op == "attention_unfused" else ("k_cache", "v_cache")  # the fused ones read the cache
    assert set(ins) == {"q", k, v} and [t.name for t in lowered.outputs] == ["o"]
    assert ins[k].shape[1] == params["kv_heads"]
    if op == "flash_attention":
        (k,) = lowered.kernels
        assert k.core_type is CoreType.MIX
        assert lowered.workspace_bytes == k.workspace_bytes > 0
    if op == "decode_attention":  # vector kernel + combine; under GQA (or bf16) the cube's MIX kernel
        grouped = params["heads"] > params["kv_heads"]
        assert [k.core_type for k in lowered.kernels] == ([CoreType.MIX] if grouped else [CoreType.AIV] * 2)
    if op == "attention_unfused":
        types = [k.op_type for k in lowered.kernels]  # PV may zero its output first (split K)
        assert types[:4] == ["batch_matmul", "scale", "masked_fill", "softmax"] and types[-1] == "batch_matmul"


def test_flash_attention_workspace_is_per_block_and_small():
    """Two S, P and partial-O slots per block, nothing of size S x S."""
    lowered = lower("flash_attention", attn(heads=32, head_dim=128, seq_q=4096), HW)
    (k,) = lowered.kernels
    per_block = lowered.workspace_bytes // k.block_dim
    assert per_block <= 1 << 20
    assert lowered.workspace_bytes < 4096 * 4096 * 2  # less than one head's scores
    assert all(t.nbytes < 4096 * 4096 * 2 * 32 for t in k.gm)


def test_non_causal_heads_loop_instead_of_unrolling():
    lowered = lower("flash_attention", attn(heads=24, head_dim=128, seq_q=4096), HW)
    (k,) = lowered.kernels
    assert len(k.aic) == 1 and len(k.aiv) == 1  # one Program for all blocks
    loops = [i for i in k.aic[0].body if isinstance(i, Loop)]
    assert loops and loops[0].var == "tt"


@pytest.fixture(scope="module")
def prefill():
    """The decoder's prefill attention: S = 4096, 32 heads, head_dim 128, causal."""
    params = attn(heads=32, head_dim=128, seq_q=4096, causal=True)
    return {op: run(op, **params) for op in ("flash_attention", "attention_unfused")}


def test_flash_attention_beats_the_unfused_chain(prefill):
    (fa, r_fa), (un, r_un) = prefill["flash_attention"], prefill["attention_unfused"]
    for name, lowered, r in (("flash_attention", fa, r_fa), ("unfused chain", un, r_un)):
        print(f"\n{name:16s} {r.us:9.1f} us  {len(lowered.kernels)} kernel(s)  GM {r.stats.gm_bytes / 1e9:6.2f} GB  "
              f"HBM {hbm_bytes(r) / 1e9:6.2f} GB  memory {memory_bytes(lowered) / 2**20:8.1f} MiB "
              f"(workspace {lowered.workspace_bytes / 2**20:.1f} MiB)")
    assert r_fa.us < r_un.us / 2
    assert r_fa.stats.gm_bytes < r_un.stats.gm_bytes
    assert hbm_bytes(r_fa) < hbm_bytes(r_un) / 10
    assert memory_bytes(fa) < memory_bytes(un) / 5
    # the chain holds the S x S scores (and probabilities) in GM; FlashAttention never does
    sxs = 32 * 4096 * 4096 * 2
    assert max(t.nbytes for k in un.kernels for t in k.gm) >= sxs
    assert max(t.nbytes for k in fa.kernels for t in k.gm) < sxs


def test_causal_skips_the_masked_half():
    full = run("flash_attention", **attn(heads=24, head_dim=128, seq_q=1024))[1]
    causal = run("flash_attention", **attn(heads=24, head_dim=128, seq_q=1024, causal=True))[1]
    # the kernels' own time (the kernel start, one fixed cost, is not halved by a mask)
    assert causal.kernel_cycles < 0.7 * full.kernel_cycles
    assert causal.stats.gm_bytes < 0.7 * full.stats.gm_bytes
    assert causal.lowered.flops == pytest.approx(full.lowered.flops / 2, rel=0.01)


def test_gqa_reads_less_kv():
    mha_l, mha = run("flash_attention", **attn(heads=32, kv_heads=32, head_dim=128, seq_q=512, causal=True))
    gqa_l, gqa = run("flash_attention", **attn(heads=32, kv_heads=8, head_dim=128, seq_q=512, causal=True))
    kv = {name: sum(t.nbytes for t in lw.inputs if t.name in ("k_cache", "v_cache"))
          for name, lw in (("mha", mha_l), ("gqa", gqa_l))}
    assert kv["gqa"] * 4 == kv["mha"]
    q_o = 2 * 32 * 512 * 128 * 2
    assert gqa.stats.hbm_read_bytes < mha.stats.hbm_read_bytes
    assert mha.stats.hbm_read_bytes - gqa.stats.hbm_read_bytes >= 0.9 * (kv["mha"] - kv["gqa"])
    assert gqa.stats.hbm_read_bytes < q_o / 2 + kv["gqa"] * 1.1
    # decode: the KV cache is the traffic, a quarter of it under GQA
    d_mha = run("decode_attention", batch=2, heads=32, kv_heads=32, head_dim=128, context=512)[1]
    d_gqa = run("decode_attention", batch=2, heads=32, kv_heads=8, head_dim=128, context=512)[1]
    assert d_gqa.stats.gm_read_bytes < 0.3 * d_mha.stats.gm_read_bytes
    assert d_gqa.stats.hbm_read_bytes < 0.3 * d_mha.stats.hbm_read_bytes


def test_decode_streams_its_kv_as_silicon_does():
    """Decode attention's roofline is HBM's (its arithmetic is far below its bytes), but its
    busiest unit is the vector one: on silicon the decode FusedInferAttentionScore rows of
    32 heads of 128 stream their KV cache below the sustained rate (0.5-1.0 TB/s, the
    measured rows below), and npusim's, with the calibrated vector costs, streams it within
    that range."""
    from pathlib import Path

    from npusim.calibrate.profile import read_csv

    data = Path(__file__).parents[1] / "npusim" / "data" / "measured" / "attention.csv"
    rates = []
    for row in read_csv(data):
        q, kv = row.input_shapes[:2]
        if row.op_type == "FusedInferAttentionScore" and q[1] == 1 and q[2:] == kv[2:] == (32, 128):
            rates.append(2 * math.prod(kv) * 2 / (row.duration_us * 1e-6))  # K and V, fp16 or bf16
    assert len(rates) >= 3
    batch, context = 4, 1024
    lowered, r = run("decode_attention", batch=batch, heads=32, kv_heads=32, head_dim=128, context=context)
    rate = 2 * batch * context * 32 * 128 * 2 / r.seconds
    assert min(rates) <= rate <= max(rates), (rate, rates)
    assert r.roofline.hbm_s > r.roofline.compute_s


@pytest.mark.parametrize("op, params, tiling, buffer", [
    ("flash_attention", attn(heads=1, head_dim=4096, seq_q=128), None, "L1: buffer 'k_l1_"),
    ("flash_attention", attn(heads=1, head_dim=512, seq_q=128), dict(q_tile=128), "UB: buffer 'o_part'"),
    ("flash_attention", attn(heads=1, head_dim=512, seq_q=128), dict(q_tile=128, d_chunk=512), "L0A: buffer 'a_l0_0'"),
    ("decode_attention", dict(batch=1, heads=1, kv_heads=1, head_dim=16384, context=64), None, "UB: buffer 'k_ub_0'"),
])
def test_a_tile_that_does_not_fit_is_one_line_naming_the_buffer(op, params, tiling, buffer):
    """The tiling picks smaller tiles for larger heads; past the smallest, the error
    names the buffer that overflows. FlashAttention splits a large head over head_dim
    in L0 (tiling.d_chunk), so L1 and UB, which hold it whole, run out first; with
    the whole head in L0 (d_chunk >= head_dim) L0A does."""
    with pytest.raises(ProgramError) as e:
        lower(op, params, HW, tiling=tiling)
    assert buffer in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="kv_heads=3 must divide heads=8"):
        lower("flash_attention", attn(heads=8, kv_heads=3), HW)
    with pytest.raises(ConfigError, match="seq_q"):
        lower("flash_attention", attn(seq_q=256, seq_kv=128, causal=True), HW)
    with pytest.raises(ConfigError, match="kv_heads"):
        lower("decode_attention", dict(heads=8, kv_heads=16), HW)


# ---- KV-cache layouts


LAYOUT_CASES = [
    ("decode_attention", dict(batch=2, heads=8, kv_heads=2, head_dim=128, context=1000)),
    ("decode_attention", dict(batch=1, heads=4, kv_heads=4, head_dim=64, context=300)),  # padded rows
    ("flash_attention", attn(batch=2, heads=4, kv_heads=2, head_dim=128, seq_q=200, seq_kv=520, causal=True)),
    ("flash_attention", attn(heads=2, head_dim=64, seq_q=256)),
]
KV_NAMES = {"per_layer": {"k_cache", "v_cache"}, "contiguous": {"kv_cache"},
            "paged": {"k_cache", "v_cache", "block_table"}}


@pytest.mark.parametrize("layout, block_tokens", [("per_layer", 128), ("contiguous", 128), ("paged", 128),
                                                  ("paged", 16)])
@pytest.mark.parametrize("op, params", LAYOUT_CASES, ids=lambda x: x if isinstance(x, str) else "-".join(
    f"{k}{v}" for k, v in x.items()))
def test_every_kv_layout_lowers_verifies_and_stays_above_the_roofline(op, params, layout, block_tokens):
    """The readers' GM tensors are kv_cache_write's for the same layout (one name each
    for the same bytes), and every layout's kernel runs and never beats its roofline."""
    cache = dict(kv_layout=layout, layers=3, layer=1, block_tokens=block_tokens)
    lowered, r = run(op, **params, **cache)
    assert r.seconds >= r.roofline.time_s
    gm = {t.name: t.nbytes for k in lowered.kernels for t in k.gm}
    assert KV_NAMES[layout] <= set(gm) and not {"k", "v"} & set(gm)
    ctx = params.get("context") or params["seq_kv"]
    writer = lower("kv_cache_write", dict(batch=params["batch"], kv_heads=params["kv_heads"],
                                          head_dim=params["head_dim"], context=ctx, layout=layout, **{
                                              k: v for k, v in cache.items() if k != "kv_layout"}), HW)
    written = {t.name: t.nbytes for t in writer.kernels[0].gm if t.name not in ("k", "v")}
    assert written == {name: gm[name] for name in KV_NAMES[layout]}


def segments(op: str, params: dict, **cache) -> tuple[int, object]:
    _, r = run(op, **params, **cache)
    return r.stats.dma_segments, r


def test_paged_decode_reads_one_segment_per_block():
    """Decode on the vector cores: per_layer reads a tile of K (and of V) in one segment,
    contiguous a tile of K and V together in one, paged one per block of K and of V
    (plus the table)."""
    params = dict(batch=2, heads=2, kv_heads=2, head_dim=128, context=1024)
    per_layer, r_pl = segments("decode_attention", params)
    contiguous, _ = segments("decode_attention", params, kv_layout="contiguous", layers=2)
    paged, _ = segments("decode_attention", params, kv_layout="paged", block_tokens=128)
    small, r_small = segments("decode_attention", params, kv_layout="paged", block_tokens=16)
    assert contiguous < per_layer < paged < small
    blocks = 2 * 2 * 1024 // 16  # (batch x kv heads) x blocks of each
    assert small >= 2 * blocks  # K and V
    assert r_small.us >= r_pl.us


def test_contiguous_flash_attention_reads_k_and_v_as_half_rows():
    """Prefill: the cube needs K two steps before V, so the contiguous layout's K and V
    are read separately, one strided piece per token row (the other half comes from L2)."""
    params = attn(heads=2, head_dim=128, seq_q=512)
    _, r_pl = segments("flash_attention", params)
    contiguous, r_c = segments("flash_attention", params, kv_layout="contiguous")
    assert contiguous >= 2 * 2 * 512  # a segment per token, K and V, each head
    assert r_c.stats.hbm_read_bytes <= 1.1 * r_pl.stats.hbm_read_bytes  # rows cross HBM once


def test_kv_layout_parameters_are_checked():
    with pytest.raises(ConfigError, match="'layer' 2 must be < layers 2"):
        lower("decode_attention", dict(kv_layout="contiguous", layers=2, layer=2), HW)
    with pytest.raises(ConfigError, match="kv_layout"):
        lower("flash_attention", attn() | dict(kv_layout="blocked"), HW)
    with pytest.raises(ProgramError, match="head_dim=24 makes a head 48 bytes"):
        lower("decode_attention", dict(batch=1, heads=1, kv_heads=1, head_dim=24, context=64,
                                       kv_layout="paged"), HW)


@pytest.mark.parametrize("position", [-1, 0])
def test_a_cache_write_of_more_tokens_than_the_cache_holds(position):
    """position -1 (the default: context - new_tokens) started at -4: verify's error on a
    copy outside every GM tensor, naming no parameter."""
    with pytest.raises(ConfigError, match=r"^op kv_cache_write: 'new_tokens' 8 exceeds context 4 \(the tokens the "
                                          r"cache holds per sequence\)$"):
        lower("kv_cache_write", dict(batch=1, kv_heads=2, head_dim=64, new_tokens=8, context=4, layers=1,
                                     position=position), HW)


@pytest.mark.parametrize("layout", ["per_layer", "contiguous"])
def test_decode_blocks_share_one_program(layout):
    """Decode at batch 8, 32 heads, context 4096: with a block per (batch, kv head) and its
    whole context, every block runs one Program (addresses affine in `block`), verified
    and compiled once; split contexts share one per run of a split's blocks."""
    from npusim.isa.verify import verify

    params = dict(batch=8, heads=32, kv_heads=32, head_dim=128, context=4096, kv_layout=layout)
    whole = lower("decode_attention", params, HW, tiling=dict(splits=1)).kernels[0]
    assert whole.block_dim == 8 * 32 and len(whole.aiv) == 1
    verify(whole, HW)
    chosen = lower("decode_attention", params, HW)  # the chosen tiling splits each context
    split = chosen.kernels[0]
    assert chosen.tiling.splits > 1 and split.block_dim == 8 * 32 * chosen.tiling.splits
    assert len({id(p) for p in split.aiv}) <= split.block_dim // 8
    verify(split, HW)
    # the other layers of a contiguous cache sit between two sequences: a program per sequence
    layered = lower("decode_attention", params | dict(layers=4, layer=1), HW, tiling=dict(splits=1)).kernels[0]
    assert len({id(p) for p in layered.aiv}) == (8 if layout == "contiguous" else 1)
    verify(layered, HW)


def test_a_forced_decode_split_past_the_context_tiles_is_an_error_not_a_quiet_clamp():
    """splits=1000 over context 1024 ran as the 8 splits of its 128-key tiles; the most it
    can be runs as given."""
    params = dict(batch=1, heads=8, kv_heads=8, head_dim=128, context=1024)
    with pytest.raises(ProgramError, match=r"tiling splits=1000 exceeds the 8 kv_tile=128 tiles of context=1024"):
        lower("decode_attention", params, HW, tiling=dict(kv_tile=128, splits=1000))
    assert lower("decode_attention", params, HW, tiling=dict(kv_tile=128, splits=8)).tiling.splits == 8


def test_grouped_decode_reads_each_kv_head_once_on_the_cube():
    """Under GQA, decode attention is FlashAttention's MIX kernel with a KV head's group of
    query heads as one Q tile: the cache is read once (HBM and GM alike), not once per
    query head."""
    params = dict(batch=4, heads=32, kv_heads=4, head_dim=128, context=4096)
    lowered, r = run("decode_attention", **params)
    assert [k.core_type for k in lowered.kernels] == [CoreType.MIX]
    cache = sum(t.nbytes for t in lowered.inputs if t.name in ("k_cache", "v_cache"))
    assert cache <= r.stats.hbm_read_bytes < 1.1 * cache and r.stats.gm_bytes < 1.5 * cache  # + S, P, O workspace
    per_head = lower("flash_attention", attn(batch=4, heads=32, kv_heads=4, head_dim=128, seq_q=1, seq_kv=4096),
                     HW, dict(q_tile=16))  # a tiling given: one query head per Q tile
    assert simulate_op(per_head, HW, trace="kernel").stats.gm_bytes > 7 * cache  # 8 query heads per KV head
