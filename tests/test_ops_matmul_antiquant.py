"""W8A16 past the MSD template (npusim.ops.matmul_antiquant): CANN's WeightQuantBatchMatmulV2
Custom template, the AIVs antiquantising the weight into workspace slots a chunk of N at
a time, the cube multiplying each chunk after a SyncAll."""

import pytest

from npusim.hw import load_hw
from npusim.isa.program import CoreType, SyncAll
from npusim.ops import lower, simulate_op
from npusim.ops.matmul_antiquant import WEIGHT_CACHE_COUNT
from npusim.passes.validate_kernels import check_op

HW = load_hw("ascend910b2")


def test_m_past_msd_makes_one_mix_kernel_with_a_sync_per_chunk():
    low = lower("matmul", dict(m=96, n=13824, k=512, weight_dtype="int8"), HW)
    (kernel,) = low.kernels
    assert kernel.core_type is CoreType.MIX and kernel.block_dim == HW.chip.aic_count
    chunks = 3  # 54 tile columns of 256, 24 a chunk
    assert all(sum(x.__class__ is SyncAll for x in p.body) == chunks for p in kernel.aiv)
    assert all(sum(x.__class__ is SyncAll for x in p.body) == chunks for p in kernel.aic)
    assert low.workspace_bytes == min(chunks, WEIGHT_CACHE_COUNT) * 512 * 24 * 256 * 2
    msd = lower("matmul", dict(m=64, n=13824, k=512, weight_dtype="int8"), HW)
    assert msd.workspace_bytes != low.workspace_bytes  # m <= 64: the MSD template


@pytest.mark.parametrize("params", [
    dict(m=80, n=300, k=200),
    dict(m=80, n=300, k=200, dtype="bf16", out_dtype="bf16"),
    dict(m=130, n=3300, k=48),  # two tile rows: 12 tile columns a chunk, 2 chunks
    dict(m=100, n=7000, k=40, dtype="bf16", out_dtype="bf16"),  # 2 chunks, the last narrower
])
def test_antiquantised_matmuls_match_numpy(params):
    c = check_op("matmul", params | dict(weight_dtype="int8"), HW)
    assert c.status == "pass", c.row()


def test_antiquantising_costs_more_than_widening_on_mte1():
    """The weight crosses GM three times and nothing overlaps a single chunk's
    antiquantisation: 128 x 5120 x 5120 takes 75.66 us on the 910B2 (weight_quant_matmul.csv),
    more than the fp16 GEMM of the same shape would need for its weight."""
    us = simulate_op(lower("matmul", dict(m=128, n=5120, k=5120, weight_dtype="int8"), HW), HW, "kernel").us
    assert 55 < us < 95
