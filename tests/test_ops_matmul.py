"""MatMul / BatchMatMul lowerings: verify() holds, nothing beats its roofline, the
efficiency targets hold on the default config, bad tilings fail in one line."""

import math

import attrs
import numpy as np
import pytest

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.hw.derived import cube_peak_flops_per_s
from npusim.isa.program import Copy, CoreType, Loop, Mem
from npusim.isa.verify import verify
from npusim.ops import OPS, lower, simulate_op
from npusim.ops.build import cdiv
from npusim.ops.matmul_tiling import unit_cycles
from npusim.ops.reference import RefContext

HW = load_hw("ascend910b2")
CTX = RefContext((1,), "prefill", lambda x, dtype: np.asarray(x, dtype=np.float32))

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


def _gemm_4096(hw, fmt: str):
    return simulate_op(lower("matmul", dict(m=4096, n=4096, k=4096, format_a=fmt, format_b=fmt), hw), hw,
                       trace="kernel")


def test_gemm_4096_reaches_70_percent_of_cube_peak():
    """NZ operands reach 70% of the cube peak (silicon's 4096^3 reaches 74%: the Mmad
    start-up, fitted on the public GEMMs, is the rest; tests/test_fidelity.py). ND tiles arrive as one DMA segment per
    row (a row of A is base_k * step_k fp16, one of B base_n fp16: 512 bytes each). A
    segment costs dma.segment_cycles of the DMA engine overlapped with the data, so a
    copy is held to one 512-byte row per segment_cycles: on the default config that is
    above the core's port, and ND costs what NZ does; with a DMA engine slow enough
    that the rows fall below the port, the ND tiles pay per segment while NZ's (4 KiB
    and 8 KiB segments) still run at the port rate."""
    peak = cube_peak_flops_per_s(HW, "fp16")
    nz, nd = _gemm_4096(HW, "NZ"), _gemm_4096(HW, "ND")
    print(f"\n4096^3 fp16: NZ operands {nz.tflops:.1f} TFLOPS = {100 * nz.tflops * 1e12 / peak:.0f}% of peak; "
          f"ND operands {nd.tflops:.1f} TFLOPS = {100 * nd.tflops * 1e12 / peak:.0f}%")
    assert nz.tflops * 1e12 >= 0.7 * peak
    t = nd.lowered.tiling
    assert t == nz.lowered.tiling
    row = t.base_k * t.step_k * 2
    assert row == t.base_n * 2 == 512
    port = HW.aic.gm_read_bytes_per_cycle
    assert row / HW.dma.segment_cycles > port  # the rows' DMA time hides under the port's
    assert nd.us == nz.us
    # 8 cycles a segment: a 512-byte row per 8 cycles = 64 B/cycle, below the 110 B/cycle port
    slow = load_hw("ascend910b2", overrides={"dma.segment_cycles": 8})
    assert row / slow.dma.segment_cycles < port < 4096 / slow.dma.segment_cycles
    nz_slow, nd_slow = _gemm_4096(slow, "NZ"), _gemm_4096(slow, "ND")
    assert nd_slow.lowered.tiling == t
    print(f"dma.segment_cycles=8: NZ {nz_slow.us:.1f} us, ND {nd_slow.us:.1f} us")
    assert nd_slow.us > nz_slow.us


@pytest.mark.parametrize("n", [4096, 8448])
def test_decode_gemv_kernel_streams_weights_at_85_percent_of_hbm(n):
    """The GEMV kernel's own time (its start aside: a fixed cost, not streaming) reads the
    weights at 85% of sustained HBM or better."""
    sustained = HW.hbm.peak_bw_bytes_per_s * HW.hbm.bw_efficiency
    r = simulate_op(lower("matmul", dict(m=1, n=n, k=4096, format_b="NZ"), HW), HW, trace="kernel")
    weights, seconds = 4096 * n * 2, HW.us(r.kernel_cycles) * 1e-6
    print(f"\nGEMV 1x4096x{n}: {r.us:.1f} us ({HW.us(r.start_cycles):.1f} of them the kernel start); the kernel "
          f"reads the weights at {weights / seconds / 1e12:.3f} TB/s = {100 * weights / seconds / sustained:.0f}% "
          f"of sustained HBM ({sustained / 1e12:.2f} TB/s)")
    assert weights / seconds >= 0.85 * sustained


def test_split_k_only_when_it_pays_for_the_zero_fill_kernel():
    """The chooser splits K only when the tiles cannot fill the cores and the split
    saves more than the start of the AIV kernel that zeroes C before the atomic adds
    (runtime.kernel_start_aiv_cycles); and no tiling beats every byte of A, B and C
    over the sustained HBM rate:
    - 4096^3: the tiles fill the cores, no split;
    - a decode GEMV (1 x 4096 x 4096): 16 tiles on 24 cores, but B's bytes cross HBM
      whatever the split, so a split would only add the zero-fill's start: no split,
      and a forced split is slower when simulated;
    - one 16 x 256 tile over K = 8192: one core would do all of K, far above the HBM
      floor: split, and faster than unsplit; but with a zero-fill start as dear as
      that one core's whole tile (the chooser's unit_cycles), no split can pay."""
    assert lower("matmul", dict(m=4096, n=4096, k=4096), HW).tiling.split_k == 1

    gemv = dict(m=1, n=4096, k=4096)
    low = lower("matmul", gemv, HW)
    assert low.tiling.split_k == 1 and low.tiling.block_dim < HW.chip.aic_count
    chosen = simulate_op(low, HW, trace="kernel")
    for split_k in (2, 4):  # on as many cores as the split's tiles may take
        forced = simulate_op(lower("matmul", gemv, HW, tiling=dict(split_k=split_k, block_dim=HW.chip.aic_count)),
                             HW, trace="kernel")
        assert [k.name for k in forced.lowered.kernels] == ["matmul_zero_c", "matmul"]
        assert forced.us > chosen.us

    deep = dict(m=16, n=256, k=8192)
    low = lower("matmul", deep, HW)
    t = low.tiling
    assert t.split_k > 1 and [k.name for k in low.kernels] == ["matmul_zero_c", "matmul"]
    assert low.kernels[0].core_type is CoreType.AIV  # the zero-fill starts as an AIV kernel
    unsplit = simulate_op(lower("matmul", deep, HW, tiling=dict(split_k=1)), HW, trace="kernel")
    assert simulate_op(low, HW, trace="kernel").us < unsplit.us
    f = HW.aic.mmad_fractals["fp16"]
    whole = unit_cycles(HW, f, t.base_m, t.base_n, deep["k"], t.base_k, 2, 2)  # one core, all of K
    dear = load_hw("ascend910b2", overrides={"runtime.kernel_start_aiv_cycles": math.ceil(whole)})
    assert lower("matmul", deep, dear).tiling.split_k == 1


def test_explicit_tiling_is_used_and_changes_time():
    params = dict(m=512, n=512, k=1024)
    auto = simulate_op(lower("matmul", params, HW), HW, trace="kernel")
    single = simulate_op(lower("matmul", params, HW, tiling=dict(base_m=128, base_n=256, base_k=64, step_k=4,
                                                                  l1_double=False, l0_double=False)), HW,
                         trace="kernel")
    assert single.lowered.tiling.l1_double is False
    assert single.us > auto.us  # no overlap of loads and compute


def test_tiling_that_does_not_fit_names_the_buffer():
    with pytest.raises(ProgramError, match=r"tiling does not fit L1: buffer 'b_chunk0' needs \d+ bytes.*L1 \(524288 bytes, aic.l1_bytes\)"):
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


# n_parts: C written as separate GM tensors c0, c1, ... (a fused QKV projection)
# (op, params, whether some tile straddles a part boundary under the chosen base_n)
PARTS = [
    ("matmul", dict(m=8, n=12288, k=4096, trans_b=True, format_b="NZ", n_parts=(4096, 4096, 4096)), False),
    ("matmul", dict(m=8, n=6144, k=4096, n_parts=(4096, 1024, 1024)), False),
    ("matmul", dict(m=8, n=6144, k=4096, n_parts=(2000, 4144)), True),
    ("matmul", dict(m=1, n=4100, k=4096, format_b="NZ", n_parts=(1000, 3000, 100)), True),  # widths off 16
    ("matmul", dict(m=1, n=260, k=8192, format_b="NZ", n_parts=(100, 150, 10)), True),  # split K, widths off 16
    ("matmul", dict(m=100, n=300, k=200, bias=True, n_parts=(100, 120, 80)), True),
    ("batch_matmul", dict(batch=4, m=100, n=300, k=128, n_parts=(100, 200)), True),
]


def test_n_parts_cover_a_k_split():
    """One PARTS entry splits K, so the zero-fill of every part is checked."""
    assert any(lower(op, params, HW).tiling.split_k > 1 for op, params, _ in PARTS)


def _tensor_at(kernel, a) -> str:
    a = a if isinstance(a, int) else a.base
    return next(t.name for t in kernel.gm if t.addr <= a < t.addr + t.nbytes)


def _fixpipe_writes(body) -> list[list[Copy]]:
    """The L0C -> GM copies of each instruction list (one tile's writes share a list)."""
    out, here = [], []
    for x in body:
        if isinstance(x, Loop):
            out += _fixpipe_writes(x.body)
        elif isinstance(x, Copy) and x.src is Mem.L0C:
            here.append(x)
    return out + ([here] if here else [])


@pytest.mark.parametrize(("op", "params", "straddles"), PARTS, ids=[f"{o}-{p['n_parts']}" for o, p, _ in PARTS])
def test_n_parts_write_each_part_and_never_beat_the_roofline(op, params, straddles):
    low = lower(op, params, HW)
    whole = lower(op, {k: v for k, v in params.items() if k != "n_parts"}, HW)
    lead = (params["batch"],) if "batch" in params else ()
    assert [(t.name, t.shape) for t in low.outputs] == [
        (f"c{i}", lead + (params["m"], w)) for i, w in enumerate(params["n_parts"])]
    assert low.min_gm_bytes == whole.min_gm_bytes
    r = simulate_op(low, HW, trace="kernel")  # runs verify() on every kernel
    assert r.seconds >= r.roofline.time_s
    assert r.stats.flops == pytest.approx(low.flops)
    assert r.stats.gm_write_bytes >= sum(t.nbytes for t in low.outputs)
    mm = low.kernels[-1]
    tiles = [tile for prog in mm.aic for tile in _fixpipe_writes(prog.body)]
    assert {_tensor_at(mm, w.dst_addr) for tile in tiles for w in tile} == {t.name for t in low.outputs}
    starts = [sum(params["n_parts"][:i]) for i in range(1, len(params["n_parts"]))]
    assert any(s % low.tiling.base_n for s in starts) == straddles
    # a tile straddling a boundary is one FixPipe write per part, each into its own tensor
    assert any(len(tile) > 1 for tile in tiles) == straddles
    assert all(len({_tensor_at(mm, w.dst_addr) for w in tile}) == len(tile) for tile in tiles)
    if low.tiling.split_k > 1:  # the fill kernel zeroes every part before the atomic adds
        zero = low.kernels[0]
        assert {t.name for t in zero.gm} == {t.name for t in low.outputs}
        z = simulate_op(attrs.evolve(low, kernels=[zero]), HW, trace="kernel")
        assert z.stats.gm_write_bytes >= sum(t.nbytes for t in low.outputs)


def test_a_fused_qkv_costs_about_the_unsplit_gemm():
    """Same work, same bytes: writing C as three tensors costs at most a few percent."""
    whole = simulate_op(lower("matmul", dict(m=8, n=6144, k=4096), HW), HW, trace="kernel")
    qkv = simulate_op(lower("matmul", dict(m=8, n=6144, k=4096, n_parts=(4096, 1024, 1024)), HW), HW,
                      trace="kernel")
    print(f"\n8x4096x6144: one C {whole.us:.2f} us, n_parts=(4096, 1024, 1024) {qkv.us:.2f} us "
          f"({100 * (qkv.us / whole.us - 1):+.1f}%)")
    assert qkv.us == pytest.approx(whole.us, rel=0.03)


@pytest.mark.parametrize("n_parts", [(4096, 1024), (4096, 2048, 0), "4096,1024,1024,1"])
def test_bad_n_parts(n_parts):
    with pytest.raises(ConfigError, match=r"^op matmul: 'n_parts' must be positive column widths summing to "
                                          r"n=6144, got \([0-9, ]+\)$"):
        lower("matmul", dict(m=8, n=6144, k=4096, n_parts=n_parts), HW)


# ---- fp32 on the cube: A and B fp32, the fp32 fractal (16 x 16 x 8: half the fp16 MACs per cycle) ----


def test_fp32_takes_twice_the_cube_cycles_of_fp16():
    """The M pipe's cycles summed over cores, in closed form: ceil(m/m0) * ceil(n/n0) *
    ceil(k/k0) fractal cycles (the tiles are whole fractals) plus one start-up per Mmad
    (one per base_k slice of each tile); k0 is 16 for fp16, 8 for fp32."""
    m = n = k = 1024
    runs = {}
    for dtype in ("fp16", "fp32"):
        low = lower("matmul", dict(m=m, n=n, k=k, dtype=dtype), HW)
        t, f = low.tiling, HW.aic.mmad_fractals[dtype]
        assert t.split_k == 1
        runs[dtype] = r = simulate_op(low, HW, trace="kernel")
        mmads = cdiv(m, t.base_m) * cdiv(n, t.base_n) * cdiv(k, t.base_k)
        fractals = cdiv(m, 16) * cdiv(n, 16) * cdiv(k, f.k0)
        assert (f.m0, f.n0) == (16, 16)
        assert r.stats.busy_cycles["AIC.M"] == fractals + mmads * HW.aic.mmad_startup_cycles
    fp16, fp32 = runs["fp16"], runs["fp32"]
    print(f"\n1024^3: fp16 {fp16.us:.2f} us, fp32 {fp32.us:.2f} us; cube cycles x"
          f"{fp32.stats.busy_cycles['AIC.M'] / fp16.stats.busy_cycles['AIC.M']:.3f}")
    assert fp32.stats.busy_cycles["AIC.M"] == pytest.approx(2 * fp16.stats.busy_cycles["AIC.M"], rel=0.01)
    assert fp32.roofline.compute_s == pytest.approx(2 * fp16.roofline.compute_s)  # the fp32 cube peak is half
    # twice the cube work and twice the bytes: the kernels' own time (the kernel start aside) nearly doubles
    assert 1.5 * fp16.kernel_cycles < fp32.kernel_cycles < 2.2 * fp16.kernel_cycles


FP32_SHAPES = [
    dict(m=1, n=4096, k=4096),
    dict(m=16, n=1000, k=4099, bias=True),
    dict(m=128, n=8448, k=4096, trans_b=True),
    dict(m=100, n=300, k=200, out_dtype="fp32"),
    dict(m=4096, n=4096, k=512, out_dtype="bf16"),
    dict(m=2048, n=256, k=65536),  # the largest A panel that may stay resident
    dict(m=512, n=512, k=512, format_a="NZ", format_b="NZ"),
    dict(m=8, n=6144, k=4096, n_parts=(4096, 1024, 1024)),
]


@pytest.mark.parametrize("params", FP32_SHAPES, ids=str)
def test_fp32_chosen_tiles_fit_and_kernels_verify(params):
    """The chooser's tiles hold 4-byte elements: base_k is 4 fp32 fractals deep (32), so a
    slice takes the bytes an fp16 one does; Buffers would refuse a tile that does not fit."""
    low = lower("matmul", dict(params, dtype="fp32"), HW)
    t = low.tiling
    assert t.base_k == 4 * HW.aic.mmad_fractals["fp32"].k0 == 32
    used = {}
    for b in low.kernels[-1].aic[0].buffers:
        used[b.mem] = max(used.get(b.mem, 0), b.addr + b.nbytes)
    assert used[Mem.L0A] <= HW.aic.l0a_bytes and used[Mem.L0B] <= HW.aic.l0b_bytes and used[Mem.L1] <= HW.aic.l1_bytes
    for k in low.kernels:
        verify(k, HW)


def test_fp32_kernels_verify_and_never_beat_the_roofline():
    r = simulate_op(lower("matmul", dict(m=100, n=300, k=200, dtype="fp32", bias=True, out_dtype="fp32"), HW), HW,
                    trace="kernel")  # runs verify() on every kernel
    assert r.seconds >= r.roofline.time_s
    assert r.stats.flops == pytest.approx(r.lowered.flops)
    assert r.stats.hbm_read_bytes >= sum(t.nbytes for t in r.lowered.inputs)
    assert [t.dtype for t in r.lowered.inputs[:2]] == ["fp32", "fp32"]


def test_fp32_reference_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((37, 70), np.float32), rng.standard_normal((50, 70), np.float32)
    bias = rng.standard_normal(50, np.float32)
    p = OPS["matmul"].params(m=37, n=50, k=70, dtype="fp32", trans_b=True, bias=True, out_dtype="fp32")
    c = OPS["matmul"].reference(p, {"a": a, "b": b, "bias": bias}, {}, CTX)["c"]
    assert c.dtype == np.float32
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.T.astype(np.float64) + bias, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("params", "message"), [
    (dict(dtype="fp32", weight_dtype="int8"), r"dtype=fp32 takes an fp32 weight"),
    (dict(dtype="fp32", weight_dtype="fp16"), r"dtype=fp32 takes an fp32 weight"),
])
def test_fp32_refuses_mixed_weights(params, message):
    with pytest.raises(ConfigError, match=message):
        lower("matmul", params, HW)


@pytest.mark.parametrize(("op", "dtype", "weight_dtype"), [("matmul", "bf16", "fp16"), ("matmul", "fp16", "bf16"),
                                                         ("batch_matmul", "bf16", "fp16")])
def test_a_weight_of_the_other_half_precision_is_refused(op, dtype, weight_dtype):
    """It was lowered as one cube multiply of a bf16 A by an fp16 B (no such Mmad), and
    --check printed FAIL: 361 off at (34, 2)."""
    with pytest.raises(ConfigError, match=rf"^op {op}: weight_dtype={weight_dtype} with dtype={dtype}: the cube "
                                          rf"multiplies A and B of one dtype \(weight_dtype empty, {dtype}, or int8"):
        lower(op, dict(m=64, n=64, k=64, dtype=dtype, weight_dtype=weight_dtype), HW)
    lower(op, dict(m=64, n=64, k=64, dtype=dtype, weight_dtype=dtype), HW)  # the dtype, named: as empty


def test_fp32_nz_a_needs_16_wide_k_slices():
    with pytest.raises(ProgramError, match=r"base_k=8 is not a multiple of 16, the column blocks of an NZ A"):
        lower("matmul", dict(m=64, n=64, k=64, dtype="fp32", format_a="NZ"), HW, tiling=dict(base_k=8))
    lower("matmul", dict(m=64, n=64, k=64, dtype="fp32"), HW, tiling=dict(base_k=8))  # ND: any fractal multiple


@pytest.mark.parametrize("m,n,k,out_dtype,tile", [
    (1024, 4096, 4096, "fp16", (128, 256, 128)),  # FixPipe dequant: the first tile, 6 rounds
    (1024, 4096, 4096, "bf16", (256, 128, 128)),  # MIX: as many rounds, less A and B in L2 in the first
    (1024, 11008, 4096, "bf16", (128, 256, 128)),  # MIX, but CheckL2Load keeps 128 x 256 here
    (2048, 1024, 1024, "fp16", (128, 256, 128)),
])
def test_w8a8_takes_quant_batch_matmul_v3s_basic_tile(m, n, k, out_dtype, tile):
    """Large W8A8 matmuls take the tile QuantBatchMatmulV3's basic tiling picks
    (npusim.ops.matmul_qbmm), base_k included, and never split K."""
    from npusim.ops.matmul import MatmulParams
    from npusim.ops.matmul_tiling import choose_tiling
    from npusim.ops.matmul_qbmm import qbmm_basic_applies
    p = MatmulParams(m=m, n=n, k=k, dtype="int8", out_dtype=out_dtype)
    assert qbmm_basic_applies(p, HW)
    t = choose_tiling(p, HW)
    assert (t.base_m, t.base_n, t.base_k, t.split_k) == (*tile, 1)


def test_small_w8a8_keeps_npusims_chooser():
    """Small M (a decode) or a small matrix is not the basic kernel's: npusim's cost model picks."""
    from npusim.ops.matmul import MatmulParams
    from npusim.ops.matmul_qbmm import qbmm_basic_applies
    assert not qbmm_basic_applies(MatmulParams(m=128, n=4096, k=2048, dtype="int8"), HW)
    assert not qbmm_basic_applies(MatmulParams(m=512, n=1024, k=1024, dtype="int8"), HW)
    assert not qbmm_basic_applies(MatmulParams(m=256, n=4096, k=4096, dtype="int8", out_dtype="bf16"), HW)


# ---- CANN MatMulV3's load balance (matmul_tiling.balanced_base_m)


@pytest.mark.parametrize("m, n", [(1024, 1024), (512, 1024), (1000, 3000), (2048, 2048), (700, 5000), (3000, 256)])
def test_the_last_round_of_128x256_tiles_is_filled_by_cutting_base_m(m, n):
    """Under 4 rounds of 128 x 256 tiles on the 24 cores, MatMulV3 rounds the tile count up
    to whole rounds and cuts base_m to share m among those rows of tiles (16-aligned);
    the tiles never outnumber those whole rounds, and W8A8 (its own tiling) is not cut."""
    from npusim.ops.matmul import MatmulParams
    from npusim.ops.matmul_tiling import balanced_base_m

    cores = HW.chip.aic_count
    p = MatmulParams(m=m, n=n, k=1024)
    n_tiles, m_tiles = cdiv(n, 256), cdiv(m, 128)
    bm = balanced_base_m(p, HW, 128, 256, 1)
    assert bm % 16 == 0 and bm <= 128
    if m_tiles * n_tiles < 4 * cores:
        rounds = cdiv(m_tiles * n_tiles, cores) * cores
        assert bm == -(-cdiv(m, rounds // n_tiles) // 16) * 16
        assert cdiv(m, bm) * n_tiles <= rounds
    assert balanced_base_m(MatmulParams(m=m, n=n, k=1024, dtype="int8"), HW, 128, 256, 1) == 128


def test_1024_cubed_takes_matmulv3s_96x256_tiles():
    """CANN's 1024^3 fp16: 44 tiles of 96 x 256 in two rounds (8 x 4 of 128 x 256 would
    leave 16 cores idle in the second)."""
    from npusim.ops.matmul import MatmulParams
    from npusim.ops.matmul_tiling import choose_tiling

    t = choose_tiling(MatmulParams(m=1024, n=1024, k=1024), HW)
    assert (t.base_m, t.base_n) == (96, 256)
