"""The one KV-cache layout value: its byte offsets (what the kernels address) agree
with its numpy pack / unpack (what the executor runs), and the hardware facts it
and the passes need come from the config."""

import numpy as np
import pytest

from npusim.graph import build_decoder
from npusim.hw import load_hw
from npusim.isa.program import DTYPE_BYTES
from npusim.kvcache import KV_LAYOUTS, PASS_KV_LAYOUTS, KvLayout
from npusim.passes import apply
from npusim.workload import load_workload

TINY = load_workload("k3-tiny")
HW = load_hw("ascend910b2")


def _layout(kind: str) -> KvLayout:
    return KvLayout(kind, batch=2, kv_heads=3, context=10, head_dim=16, dtype="fp16", layers=3, layer=1,
                    block_tokens=4, row_align_bytes=HW.dma.burst_bytes)


def _empty(c: KvLayout) -> dict[str, np.ndarray]:
    out = {name: np.zeros(shape, np.float32) for name, (shape, dt) in c.tensor_shapes().items()}
    if "block_table" in out:
        out["block_table"] = c.block_table()
    return out


@pytest.mark.parametrize("kind", KV_LAYOUTS)
def test_pack_unpack_round_trip_and_offsets_agree(kind):
    c = _layout(kind)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal(c.shape).astype(np.float32) for _ in range(2))
    phys = _empty(c) | c.pack(_empty(c), k, v)
    k2, v2 = c.unpack(phys)
    np.testing.assert_array_equal(k2, k)
    np.testing.assert_array_equal(v2, v)
    e = c.elem_bytes
    for which, x in (("k", k), ("v", v)):
        for b, h, pos in ((0, 0, 0), (1, 2, 9), (1, 1, 5), (0, 2, 4)):
            name, off = c.token_offset(which, b, h, pos)
            assert off % e == 0
            flat = phys[name].reshape(-1)
            np.testing.assert_array_equal(flat[off // e:off // e + c.head_dim], x[b, h, pos])
    assert c.tensor_bytes() == {n: int(np.prod(s)) * DTYPE_BYTES[dt] for n, (s, dt) in c.tensor_shapes().items()}


def test_paged_runs_split_at_block_edges_and_rows_pad_to_the_burst():
    c = _layout("paged")
    assert c.runs(0, 2, 7) == [(2, 2), (4, 4), (8, 1)]
    assert sorted(c.block_table().ravel()) == list(range(c.num_blocks))  # a permutation
    wide = KvLayout("contiguous", 1, 1, 4, 40, "fp16", row_align_bytes=64)
    assert wide.row_bytes == 192 and wide.tensor_shapes()["kv_cache"][0] == (1, 1, 1, 4, 96)


def test_pass_kv_layouts_are_the_layouts_but_the_baseline():
    assert set(PASS_KV_LAYOUTS) == set(KV_LAYOUTS) - {"per_layer"}


def test_kv_row_and_pool_alignment_follow_the_config_burst():
    g = build_decoder(TINY, "decode", 2, 16)
    wide = load_hw("ascend910b2", {"dma.burst_bytes": 1024, "l2.line_bytes": 1024})  # a line holds a burst
    default = apply(g, "optimized")
    burst = apply(g, "optimized", hw=wide)
    d, e = TINY.head_dim, DTYPE_BYTES[TINY.dtype]
    assert default.tensors["kv_cache"].shape[-1] * e == -(-2 * d * e // 64) * 64
    assert burst.tensors["kv_cache"].shape[-1] * e == 1024
    assert all(o % 1024 == 0 for o in burst.memory_plan.offsets.values())
    assert any(o % 1024 for o in default.memory_plan.offsets.values())
