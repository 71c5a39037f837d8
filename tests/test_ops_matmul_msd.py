"""W8A16 matmul at decode sizes as the 910B's multi-scale kernel (npusim.ops.matmul_msd):
one MIX kernel whose vector cores split A into two int8 parts, whose cube multiplies
them by the int8 weight, and whose vector cores combine and scale the result; it
computes the reference to about 15 bits (one int8 part alone would give 8), and only
the shapes CANN's template takes run it."""

import pytest

from npusim.hw import load_hw
from npusim.isa.program import CoreType
from npusim.ops import lower
from npusim.ops.matmul_msd import MSD_MAX_M
from npusim.passes.validate_kernels import check_op

HW = load_hw("ascend910b2")


@pytest.mark.parametrize("params", [
    dict(m=1, k=256, n=256),
    dict(m=3, k=512, n=96, bias=True),  # odd rows: a block's two vector cores share one
    dict(m=8, k=128, n=64, dtype="bf16", out_dtype="bf16"),
    dict(m=MSD_MAX_M, k=96, n=512, trans_b=True),
    dict(m=2, k=40960, n=64),  # a row longer than UB holds: quantised in chunks, its maximum first
], ids=str)
def test_the_multi_scale_kernel_computes_the_reference_to_about_fifteen_bits(params):
    check = check_op("matmul", params | dict(weight_dtype="int8"), HW)
    assert check.status == "pass", check.reason
    # A split into two int8 parts is within max|x| / (2 * 127^2) of x: an fp16 output's own
    # rounding (2^-11 of an element) dominates; one part alone is off by 2^-8 (a bf16
    # output's rounding is that coarse itself: the check's tolerance is all it can say)
    if params.get("out_dtype", "fp16") == "fp16":
        assert check.max_rel < 2.0 ** -10


@pytest.mark.parametrize("params, mix", [
    (dict(m=MSD_MAX_M, k=4096, n=4096), True),
    (dict(m=MSD_MAX_M + 1, k=4096, n=4096), False),  # CANN dequantises the weight above M = 64
    (dict(m=8, k=4096 + 16, n=4096), False),  # K not a multiple of 32
    (dict(m=8, k=4096, n=4096 + 16), False),
    (dict(m=8, k=4096, n=4096, n_parts=(2048, 2048)), False),
])
def test_only_the_shapes_cann_runs_it_for_take_the_multi_scale_kernel(params, mix):
    low = lower("matmul", params | dict(weight_dtype="int8", trans_b=True), HW)
    assert (low.kernels[0].core_type is CoreType.MIX) == mix
    if mix:
        m, k, n = params["m"], params["k"], params["n"]
        assert low.workspace_bytes == 2 * m * k + 64 * m + 2 * m * n * 4  # the parts, the factors, C
        assert low.kernels[0].block_dim <= HW.chip.aic_count
