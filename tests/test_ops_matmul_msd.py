"""W8A16 matmul at decode sizes as the 910B's multi-scale kernel (npusim.ops.matmul_msd):
one MIX kernel whose vector cores split A into two int8 parts, whose cube multiplies
them by the int8 weight, and whose vector cores combine and scale the result; it
computes the reference to about 15 bits (one int8 part alone would give 8), and only
the shapes CANN's template takes run it."""

import pytest

from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa.program import CoreType
from npusim.ops import lower, matmul_msd_splitk
from npusim.ops.matmul import MatmulParams
from npusim.ops.matmul_msd import MSD_MAX_M, msd_applies
from npusim.ops.matmul_msd_splitk import msd_splitk_applies, splitk_tiling
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


# ------------------------------------------------------------------ the split-K kernel
# (npusim.ops.matmul_msd_splitk): CANN's MSD tiling sets splitKFlag_ past K = 13696 or
# N = 32000 (per-channel int8) and runs weight_quant_batch_matmul_v2_msd_split_k.h


@pytest.mark.parametrize("params, split", [
    (dict(m=64, k=13696, n=4096), False),  # K = MSD_PERCHANNEL_MAX_K: not past it
    (dict(m=64, k=13696 + 32, n=4096), True),
    (dict(m=8, k=4096, n=32000), False),  # N = MSD_PERCHANNEL_MAX_N
    (dict(m=8, k=4096, n=32000 + 32), True),
    (dict(m=1, k=13728, n=64, trans_b=True), True),
    (dict(m=32, k=28672, n=8192, dtype="bf16", out_dtype="bf16", bias=True), True),  # the measured rows
    (dict(m=64, k=14336, n=4096, dtype="bf16", out_dtype="bf16"), True),
    (dict(m=MSD_MAX_M + 1, k=28672, n=8192), False),  # no MSD at all past M = 64
    (dict(m=8, k=28672 + 16, n=8192), False),  # K not a multiple of 32
    (dict(m=8, k=28672, n=8192, weight_dtype=""), False),  # not W8A16
])
def test_the_split_k_kernel_runs_exactly_past_cann_s_k_and_n_limits(params, split):
    params = dict(weight_dtype="int8") | params
    p = MatmulParams(**params)
    assert msd_splitk_applies(p) == split
    assert msd_splitk_applies(p) == (msd_applies(p) and (p.k > 13696 or p.n > 32000))
    low = lower("matmul", params, HW)
    if split:  # its workspace: per K block the row factors and both parts, then the slots of partials
        st = splitk_tiling(p, HW)
        m, loops = p.m, -(-p.n // st.task_n)
        ws = (-(-st.k_blocks * m * 64 // 512) * 512 + st.k_blocks * -(-2 * m * st.v1_base_k // 512) * 512
              + min(loops, st.cache_num) * -(-2 * m * st.task_n * st.k_blocks // 128) * 128 * 4)
        assert low.workspace_bytes == ws
        assert low.kernels[0].core_type is CoreType.MIX and low.kernels[0].block_dim == st.block_dim


@pytest.mark.parametrize("params, numbers", [
    # DoMSDGeneralOpTiling by hand: K = 28672 needs 3 blocks of <= 12K: ceil(28672 / 3) on 64 = 9600;
    # 16 MiB / (3 * 2 * 32 * 4) on 256 = 21760, at most 128 x 48 = 6144 columns a task, 128 per AIV,
    # 48 AIVs on N so 32 rows each; blkDim 48 AIVs = 24 blocks; cycle 16Ki*256 / (3*2*32*6144) = 3: 6 slots
    (dict(m=32, k=28672, n=8192, dtype="bf16"), (3, 9600, 1, 6144, 128, 32, 32, 256, 24, 6)),
    # 2 blocks of 7168; 16 MiB / (2 * 2 * 64 * 4) = 16384 -> 6144 -> N = 4096: 32 AIVs of 128 on N, 64 rows
    (dict(m=64, k=14336, n=4096, dtype="bf16"), (2, 7168, 1, 4096, 128, 64, 64, 256, 24, 8)),
    # K >= 30 N with the weight not transposed: from 4 blocks (7680 columns), where 3 (10240) would fit;
    # transposed, from 1 and on 512 columns: 3; singleCoreN 42 on 32 (MsdA16W8CommonTiling)
    (dict(m=4, k=30720, n=1024), (4, 7680, 1, 1024, 128, 1, 1, 256, 24, 16)),
    (dict(m=4, k=30720, n=1024, trans_b=True), (3, 10240, 1, 1024, 128, 1, 1, 64, 24, 16)),
    # N > 32000 at a short K: one K block, PreProcess tasks of min(8, 12288 / 4096) = 3 rows
    (dict(m=40, k=4096, n=40000), (1, 4096, 3, 6144, 128, 40, 40, 256, 24, 16)),
])
def test_the_split_k_tiling_is_cann_s(params, numbers):
    st = splitk_tiling(MatmulParams(weight_dtype="int8", **params), HW)
    assert (st.k_blocks, st.v1_base_k, st.v1_base_m, st.task_n, st.task_core_n, st.post_core_m, st.post_base_m,
            st.cube_core_n, st.block_dim, st.cache_num) == numbers


def test_past_six_k_blocks_of_12k_cann_s_tiling_fails():
    with pytest.raises(ProgramError, match="tiling fails"):
        lower("matmul", dict(m=8, k=6 * 12288 + 64, n=4096, weight_dtype="int8"), HW)


SMALL = dict(MSD_PERCHANNEL_MAX_K=256, V1_MAX_K=256)  # the split-K kernel at small K: blocks of 256


@pytest.mark.parametrize("params, limits", [
    (dict(m=2, k=704, n=256), SMALL),  # 3 K blocks, the last of 192 columns (padded with its own first 64)
    (dict(m=3, k=768, n=96, bias=True), SMALL),
    (dict(m=5, k=512, n=64, dtype="bf16", out_dtype="bf16"), SMALL),
    (dict(m=4, k=704, n=640), SMALL | dict(C_BUDGET=24576)),  # N tasks of 256: three cube loops
    (dict(m=4, k=704, n=640, bias=True), SMALL | dict(C_BUDGET=24576, SYNC_BUDGET=1)),  # two slots of partials
    (dict(m=13, k=128, n=256), dict(MSD_PERCHANNEL_MAX_N=64)),  # PreProcess tasks of 8 rows
    (dict(m=21, k=256, n=352), dict(MSD_PERCHANNEL_MAX_N=64, POST_BLOCK=128)),  # shares of 2 rows, 1 at a time
    (dict(m=4, k=1536, n=256, trans_b=True), dict(MSD_PERCHANNEL_MAX_K=256, V1_MAX_K=512)),
    (dict(m=2, k=1920, n=64), dict(MSD_PERCHANNEL_MAX_K=256, V1_MAX_K=512)),  # K >= 30 N: 4 blocks
    (dict(m=MSD_MAX_M, k=1024, n=512, bias=True), dict(MSD_PERCHANNEL_MAX_K=256, V1_MAX_K=512)),
    (dict(m=2, k=13728, n=64), {}),  # CANN's own limits: two K blocks of 6912 and 6816
    (dict(m=3, k=64, n=32032, dtype="bf16", out_dtype="bf16"), {}),  # six N tasks
], ids=str)
def test_the_split_k_kernel_computes_the_reference(params, limits, monkeypatch):
    for name, value in limits.items():
        monkeypatch.setattr(matmul_msd_splitk, name, value)
    p = MatmulParams(weight_dtype="int8", **params)
    assert msd_splitk_applies(p)
    check = check_op("matmul", params | dict(weight_dtype="int8"), HW)
    assert check.status == "pass", check.reason
    if params.get("out_dtype", "fp16") == "fp16":  # as the multi-scale kernel's: about 15 bits
        assert check.max_rel < 2.0 ** -10
