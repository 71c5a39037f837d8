"""FlashAttention over large heads: head_dim split in L0 (tiling.d_chunk).

S = Q K^T accumulates in L0C over chunks of head_dim (one Mmad per chunk, its Q and
K^T slices loaded from L1), and O = P V is made a column chunk at a time, each in an
L0C tile of its own. A head_dim 512 head keeps a 64-row q tile (the whole head in L0
allowed 32), runs the functional check clean and is faster than the unsplit lowering;
heads up to 128 are lowered as before (tests/test_engine_regression.py holds them to
the cycle).
"""

from __future__ import annotations

import pytest

from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa import Mmad
from npusim.isa.walk import unroll
from npusim.ops import lower, simulate_op
from npusim.ops.attention import FlashAttentionParams, FlashAttentionTiling, choose_flash_tiling
from npusim.passes.validate_kernels import check_op

HW = load_hw("ascend910b2")

# npusim/data/measured/attention.csv, cann-bench_tilelang_flash_attention_case15 (482 us on a 910B2)
MEASURED_512 = dict(batch=4, heads=32, kv_heads=32, head_dim=512, seq_q=512, seq_kv=512, causal=False, dtype="bf16")


def attn(batch=1, heads=2, kv_heads=None, head_dim=512, seq_q=128, seq_kv=None, causal=False, dtype="fp16", **kv):
    return dict(batch=batch, heads=heads, kv_heads=kv_heads or heads, head_dim=head_dim, seq_q=seq_q,
                seq_kv=seq_kv or seq_q, causal=causal, dtype=dtype, **kv)


def test_head_dim_512_keeps_a_64_row_q_tile_and_splits_the_head_in_l0():
    t = choose_flash_tiling(FlashAttentionParams(**MEASURED_512), HW)
    assert t.q_tile >= 64 and t.d_chunk < 512 and 512 % t.d_chunk == 0
    whole = choose_flash_tiling(FlashAttentionParams(**MEASURED_512), HW, FlashAttentionTiling(d_chunk=512))
    assert whole.q_tile < t.q_tile  # the whole head in L0A: half the rows


@pytest.mark.parametrize("head_dim", [16, 64, 96, 100, 128])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_heads_up_to_128_are_not_split(head_dim, dtype):
    t = choose_flash_tiling(FlashAttentionParams(**attn(heads=32, head_dim=head_dim, seq_q=4096, dtype=dtype)), HW)
    assert (t.q_tile, t.kv_tile, t.sub_tile) == (128, 256, 128)
    assert t.d_chunk >= head_dim  # one chunk: the whole head


def test_head_dim_512_is_faster_split_than_whole():
    """The measured shape: the split's 64-row q tiles read K and V half as often as the
    whole head's 32-row ones."""
    lowered = lower("flash_attention", MEASURED_512, HW), lower("flash_attention", MEASURED_512, HW,
                                                                tiling=dict(d_chunk=512))
    assert lowered[0].tiling.d_chunk < 512 == lowered[1].tiling.d_chunk
    split, whole = (simulate_op(low, HW) for low in lowered)
    assert split.seconds < 0.85 * whole.seconds
    assert split.seconds >= split.roofline.time_s


@pytest.mark.parametrize("params, tiling", [
    (attn(head_dim=512, seq_q=128, seq_kv=128), None),
    (attn(head_dim=512, seq_q=150, seq_kv=150, causal=True), None),  # a short last q tile, diagonal steps
    (attn(heads=4, kv_heads=2, head_dim=512, seq_q=130, seq_kv=200, causal=True, dtype="bf16"), None),  # GQA
    (attn(heads=4, kv_heads=2, head_dim=512, seq_q=3, seq_kv=100, causal=True), None),  # GQA rows packed
    (attn(heads=2, head_dim=512, seq_q=40, seq_kv=300, kv_layout="paged"), None),
    (attn(heads=2, kv_heads=1, head_dim=384, seq_q=17, seq_kv=33, causal=True), None),
    (attn(head_dim=256, seq_q=200, seq_kv=300, causal=True), dict(q_tile=128, d_chunk=128)),
    # chunks of 96, 96, 64 columns
    (attn(batch=2, heads=4, kv_heads=2, head_dim=256, seq_q=70, seq_kv=200, dtype="bf16"), dict(d_chunk=96)),
    (attn(heads=1, head_dim=200, seq_q=40, seq_kv=70), dict(d_chunk=64)),  # a last chunk of 8 columns
    (attn(heads=1, head_dim=72, seq_q=40, seq_kv=70, causal=True), dict(d_chunk=32)),
    (attn(head_dim=512, seq_q=64, seq_kv=128), dict(d_chunk=512)),  # the whole head, as before the split
], ids=lambda x: "-".join(f"{k}{v}" for k, v in x.items()) if isinstance(x, dict) else str(x))
def test_split_heads_match_the_reference(params, tiling):
    c = check_op("flash_attention", params, HW, tiling=tiling)
    assert c.status == "pass", c.row()


def test_each_chunk_is_one_mmad_of_its_columns():
    """head_dim 200 in chunks of 64: Q K^T sums four Mmads (k = 64, 64, 64, 8) into each S
    tile, P V makes O in four column chunks (n = 64, 64, 64, 8)."""
    low = lower("flash_attention", attn(heads=1, head_dim=200, seq_q=32, seq_kv=32), HW,
                tiling=dict(q_tile=32, kv_tile=32, sub_tile=32, d_chunk=64))
    (aic,) = {id(p): p for p in low.kernels[0].aic}.values()
    mm = [i for i, _ in unroll(aic.body, {"block": 0}, 10_000) if isinstance(i, Mmad)]
    assert [(m.k, m.accumulate) for m in mm[:4]] == [(64, False), (64, True), (64, True), (8, True)]
    assert [m.n for m in mm[4:]] == [64, 64, 64, 8] and not any(m.accumulate for m in mm[4:])


def test_a_chunk_that_is_not_whole_fractal_blocks_is_an_error():
    with pytest.raises(ProgramError, match="d_chunk=40 is not a multiple of 16"):
        lower("flash_attention", attn(head_dim=256), HW, tiling=dict(d_chunk=40))


@pytest.mark.parametrize(("tiling", "names"), [
    ({"vec_rows": 100000}, "vec_rows=100000"),  # ran as the AIV's 64 rows, printed as 100000
    ({"vec_rows": 65}, "vec_rows=65"),
    ({"q_splits": 1000}, "q_splits=1000"),  # ran as the head's 8 q tiles
    ({"q_splits": 9}, "q_splits=9"),
])
def test_a_forced_tiling_beyond_what_it_splits_is_an_error_not_a_quiet_clamp(tiling, names):
    """A forced value the kernel cannot take as given is refused, not run as another one
    while the tiling printed says it ran as given."""
    p = dict(batch=1, heads=30, kv_heads=30, seq_q=1024, seq_kv=1024)  # 6 leftover heads on 24 cores
    with pytest.raises(ProgramError, match=names):
        lower("flash_attention", p, HW, {"q_tile": 128} | tiling)
    ok = {k: 64 if k == "vec_rows" else 8 for k in tiling}  # the most each can be
    assert lower("flash_attention", p, HW, {"q_tile": 128} | ok).kernels
