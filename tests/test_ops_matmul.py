"""MatMul / BatchMatMul lowerings: verify() holds, nothing beats its roofline, the
efficiency targets hold on the default config, bad tilings fail in one line."""

import pytest

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.hw.derived import cube_peak_flops_per_s
from npusim.ops import lower, simulate_op

HW = load_hw("ascend910b2")

GRID = [
    ("matmul", dict(m=1, n=16, k=16)),
    ("matmul", dict(m=16, n=64, k=32)),
    ("matmul", dict(m=100, n=300, k=200, bias=True)),
    ("matmul", dict(m=1, n=4096, k=4096, format_b="NZ")),
    ("matmul", dict(m=8, n=4096, k=4096, trans_b=True)),
    ("matmul", dict(m=512, n=512, k=512, out_dtype="fp32")),
    ("matmul", dict(m=1000, n=1000, k=1000, format_a="NZ", format_b="NZ")),
    ("matmul", dict(m=32, n=4096, k=4096, weight_dtype="int8", format_b="NZ")),
    ("matmul", dict(m=512, n=512, k=512, weight_dtype="int8")),
    ("matmul", dict(m=2048, n=1024, k=512, dtype="bf16", out_dtype="bf16")),
    ("batch_matmul", dict(batch=4, m=256, n=256, k=128)),
    ("batch_matmul", dict(batch=32, m=1, n=512, k=128, trans_b=True)),
]


@pytest.mark.parametrize(("op", "params"), GRID, ids=[f"{o}-{p}" for o, p in GRID])
def test_never_below_roofline(op, params):
    r = simulate_op(lower(op, params, HW), HW, trace="kernel")  # runs verify() on every kernel
    assert r.seconds >= r.roofline.time_s
    assert r.stats.flops == pytest.approx(r.lowered.flops)  # the Mmads do exactly the op's FLOPs


@pytest.mark.parametrize(("op", "params"), [("batch_matmul", dict(batch=8, m=256, n=256, k=256)),
                                            ("batch_matmul", dict(batch=3, m=100, n=80, k=60, format_b="NZ")),
                                            ("matmul", dict(m=1000, n=1000, k=1000))])
def test_every_input_byte_is_read_and_every_output_written(op, params):
    """From a cold L2 the kernel must bring in all of A and B and write all of C (every batch)."""
    low = lower(op, params, HW)
    r = simulate_op(low, HW, trace="kernel")
    assert r.stats.hbm_read_bytes >= sum(t.nbytes for t in low.inputs)
    assert r.stats.gm_write_bytes >= sum(t.nbytes for t in low.outputs)


def test_a_partial_tiling_keeps_the_rest_of_the_chosen_one():
    chosen = lower("matmul", dict(m=1024, n=1024, k=1024), HW).tiling
    forced = lower("matmul", dict(m=1024, n=1024, k=1024), HW, tiling=dict(l0_double=False)).tiling
    assert forced.l0_double is False
    assert (forced.base_m, forced.base_n, forced.split_k) == (chosen.base_m, chosen.base_n, chosen.split_k)


def test_gemm_4096_reaches_80_percent_of_cube_peak():
    peak = cube_peak_flops_per_s(HW, "fp16")
    nz = simulate_op(lower("matmul", dict(m=4096, n=4096, k=4096, format_a="NZ", format_b="NZ"), HW), HW,
                     trace="kernel")
    nd = simulate_op(lower("matmul", dict(m=4096, n=4096, k=4096), HW), HW, trace="kernel")
    print(f"\n4096^3 fp16: NZ operands {nz.tflops:.1f} TFLOPS = {100 * nz.tflops * 1e12 / peak:.0f}% of peak; "
          f"ND operands {nd.tflops:.1f} TFLOPS = {100 * nd.tflops * 1e12 / peak:.0f}%")
    assert nz.tflops * 1e12 >= 0.8 * peak
    assert nd.us > nz.us  # ND tiles arrive as one DMA segment per row


@pytest.mark.parametrize("n", [4096, 8448])
def test_decode_gemv_reaches_70_percent_of_hbm(n):
    sustained = HW.hbm.peak_bw_bytes_per_s * HW.hbm.bw_efficiency
    r = simulate_op(lower("matmul", dict(m=1, n=n, k=4096, format_b="NZ"), HW), HW, trace="kernel")
    weights = 4096 * n * 2
    print(f"\nGEMV 1x4096x{n}: {r.us:.1f} us, weights at {weights / r.seconds / 1e12:.3f} TB/s = "
          f"{100 * weights / r.seconds / sustained:.0f}% of sustained HBM ({sustained / 1e12:.2f} TB/s)")
    assert weights / r.seconds >= 0.7 * sustained


def test_split_k_only_when_tiles_cannot_fill_the_cores():
    assert lower("matmul", dict(m=1, n=4096, k=4096), HW).tiling.split_k > 1
    assert lower("matmul", dict(m=4096, n=4096, k=4096), HW).tiling.split_k == 1


def test_explicit_tiling_is_used_and_changes_time():
    params = dict(m=512, n=512, k=1024)
    auto = simulate_op(lower("matmul", params, HW), HW, trace="kernel")
    single = simulate_op(lower("matmul", params, HW, tiling=dict(base_m=128, base_n=256, base_k=64, step_k=4,
                                                                  l1_double=False, l0_double=False)), HW,
                         trace="kernel")
    assert single.lowered.tiling.l1_double is False
    assert single.us > auto.us  # no overlap of loads and compute


def test_tiling_that_does_not_fit_names_the_buffer():
    with pytest.raises(ProgramError, match=r"tiling does not fit L1: buffer 'b_chunk0' needs \d+ bytes.*L1 has 524288"):
        lower("matmul", dict(m=512, n=512, k=512), HW, tiling=dict(base_m=512, base_n=512))


def test_tiling_off_the_fractal_grid():
    with pytest.raises(ProgramError, match=r"base_n=100 is not a multiple of the fp16 fractal \(16\)"):
        lower("matmul", dict(m=64, n=64, k=64), HW, tiling=dict(base_n=100))


@pytest.mark.parametrize(("params", "message"), [
    (dict(m=0), r"'m' must be > 0"),
    (dict(mm=3), r"unknown parameter 'mm'"),
    (dict(format_a="NCHW"), r"'format_a' must be in"),
    (dict(m="abc"), r"parameter 'm' expects int, got 'abc'"),
])
def test_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        lower("matmul", params, HW)
