"""MatMul operands whose rows the cube's DMA does not convert (an inner axis not a
multiple of 256 bytes, or longer than 65,535 elements) are converted to NZ by the
vector cores first, in the same MIX kernel, as CANN's MatMulV3 does: the rule, the
kernel's shape, its numbers against numpy, and what it costs."""

import pytest

from npusim.hw import load_hw
from npusim.isa.program import CoreType, SyncAll
from npusim.ops import lower, simulate_op
from npusim.ops.matmul import MatmulParams
from npusim.ops.matmul_nd2nz import nd2nz_operands
from npusim.passes.validate_kernels import check_op

HW = load_hw("ascend910b2")


@pytest.mark.parametrize("params, expected", [
    (dict(m=512, n=1024, k=1040), (True, False)),  # A's rows are 2080 bytes
    (dict(m=1009, n=1024, k=1024), (False, False)),  # an unaligned M is an outer axis: the DMA converts
    (dict(m=64, n=64, k=192), (False, False)),  # 384-byte rows: converted on the way whole
    (dict(m=64, n=64, k=100), (True, False)),  # 200-byte rows
    (dict(m=64, n=1025, k=64), (False, True)),  # B [k, n]: its rows are n long
    (dict(m=64, n=1025, k=64, trans_b=True), (False, False)),  # B [n, k]: rows of k; transposed B not converted
    (dict(m=64, n=64, k=1040, trans_b=True), (True, False)),
    (dict(m=8, n=16, k=70000), (True, False)),  # past the DMA's 65,535 elements
    (dict(m=511, n=511, k=511, dtype="fp32", out_dtype="fp32"), (False, False)),  # fp32 rows stay on the DMA
    (dict(m=8, n=16, k=70000, dtype="fp32", out_dtype="fp32"), (True, False)),
    (dict(m=8, n=1040, k=1040, weight_dtype="int8"), (False, False)),  # W8A16: another op, other rules
    (dict(m=8, n=1040, k=1040, dtype="int8", out_dtype="fp32"), (False, False)),  # W8A8 likewise
])
def test_which_operands_are_converted(params, expected):
    assert nd2nz_operands(MatmulParams(**params)) == expected


def test_an_unaligned_operand_makes_one_mix_kernel_that_syncs_before_the_cube():
    low = lower("matmul", dict(m=512, n=1024, k=1040), HW)
    (kernel,) = low.kernels
    assert kernel.core_type is CoreType.MIX
    assert all(p.body[0].__class__ is SyncAll for p in kernel.aic)
    assert all(p.body[-1].__class__ is SyncAll for p in kernel.aiv)
    assert low.workspace_bytes == 512 * 1040 * 2  # A in NZ: 512 rows x 65 blocks of 16 columns
    aligned = lower("matmul", dict(m=512, n=1024, k=1024), HW)
    assert aligned.kernels[0].core_type is CoreType.AIC and aligned.workspace_bytes == 0


@pytest.mark.parametrize("params", [
    dict(m=40, n=64, k=100),  # A: 100 columns, the last block half padding
    dict(m=33, n=200, k=300),  # A and B
    dict(m=64, n=64, k=136, dtype="bf16", out_dtype="bf16"),
    dict(m=17, n=48, k=1040),  # more rows than the cores' shares are even
    dict(m=3, n=16, k=70001),  # rows longer than UB holds: converted in pieces (and K split)
    dict(m=3, n=70001, k=16),  # B's rows likewise
])
def test_converted_matmuls_match_numpy(params):
    c = check_op("matmul", params, HW)
    assert c.status == "pass", c.row()


def test_the_conversion_costs_what_silicon_shows():
    """On the 910B2, 512 x 1040 x 1024 takes 18.85 us and 1024^3 15.65 (npusim/data/measured,
    gemm.csv): twice the work in less time. Converted, the unaligned GEMM costs more than
    the aligned one of 1.5% less work by far more than 1.5% (the vector pass, the SyncAll, the
    MIX kernel's start)."""
    unaligned = simulate_op(lower("matmul", dict(m=512, n=1024, k=1040), HW), HW, "kernel").us
    aligned = simulate_op(lower("matmul", dict(m=512, n=1024, k=1024), HW), HW, "kernel").us
    assert unaligned > 1.2 * aligned
