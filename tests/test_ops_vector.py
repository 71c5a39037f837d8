"""AIV operator lowerings (npusim.ops.vector, npusim.ops.layout): every op over shapes
from tiny to large lowers to kernels that pass verify() and never beat its roofline;
bandwidth-bound streaming reaches the config's sustained HBM bandwidth; layouts
differ in DMA segments and burst waste the way the chip would; bad shapes are
one-line errors. Expected numbers come from the config, never from constants."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.hw import load_hw
from npusim.isa.program import DTYPE_BYTES, VecOp
from npusim.ops import lower, simulate_op
from npusim.ops.registry import GmArena
from npusim.ops.vector_kernels import Stream, streaming_kernel

HW = load_hw("ascend910b2")

ELEMENTWISE = ("add", "mul", "relu", "scale", "scale_add", "silu", "gelu", "sigmoid", "exp", "maximum")
NORMS = ("rms_norm", "add_rms_norm", "layer_norm", "softmax")

# (op type, params): tiny (one element / row, odd sizes that need padding) to large.
CASES = [
    *[(op, {"shape": s}) for op in ELEMENTWISE for s in [(1,), (7, 33), (8, 4096), (1024, 4096)]],
    *[(op, {"shape": (8, 4096), "dtype": dt}) for op in ELEMENTWISE for dt in ("bf16", "fp32")],
    ("exp", {"shape": (3, 1000), "base": 10.0, "scale": 2.0, "shift": 0.5}),
    *[("maximum", {"shape": (1024, 1024), "dtype": dt}) for dt in ("int8", "int32", "int64")],
    # x2 broadcast: a row vector (2-D and across ranks), one value per row (5-D)
    *[("maximum", {"shape": s, "shape2": s2, "dtype": dt}) for s, s2 in [
        ((2049, 513), (1, 513)), ((255, 8193), (8193,)), ((2, 3, 5, 1024, 256), (1, 1, 1, 1024, 1)),
        ((2, 3, 17, 1024, 101), (1, 1, 1, 1024, 1)), ((7, 33), (1,))] for dt in ("fp16", "bf16", "int8", "int32")],
    ("maximum", {"shape": (2049, 513), "shape2": (1, 513), "dtype": "int64"}),
    ("cast", {"shape": (1,)}), ("cast", {"shape": (3, 1000), "dtype": "fp32", "out_dtype": "bf16"}),
    ("cast", {"shape": (1024, 4096), "dtype": "fp16", "out_dtype": "int8"}),
    ("swiglu", {"shape": (1, 32)}), ("swiglu", {"shape": (7, 2000)}), ("swiglu", {"shape": (8, 16896)}),
    ("swiglu", {"shape": (512, 16896)}), ("swiglu", {"shape": (8, 16896), "dtype": "bf16"}),
    *[(op, {"shape": s}) for op in NORMS for s in [(1, 16), (3, 1000), (8, 4096), (2048, 4096)]],
    *[(op, {"shape": (8, 4096), "dtype": dt}) for op in NORMS for dt in ("bf16", "fp32")],
    ("rms_norm", {"shape": (2, 8192)}), ("layer_norm", {"shape": (5, 8192)}),  # single-buffered
    ("add_rms_norm", {"shape": (3, 8192), "dtype": "bf16"}), ("softmax", {"shape": (256, 8192)}),
    ("softmax", {"shape": (2, 16384)}), ("softmax", {"shape": (1, 12000)}),
    # over a middle dim (npusim.ops.softmax_axis): all rows of a column block in UB, or rows in chunks
    ("softmax", {"shape": (31, 67, 127, 257), "dim": 2, "dtype": "bf16"}), ("softmax", {"shape": (4, 9, 1), "dim": 1}),
    ("softmax", {"shape": (2, 5000, 3), "dim": -2, "dtype": "fp32"}), ("softmax", {"shape": (10**7, 2, 2), "dim": 1}),
    # rows too long for UB: tiled along their columns (npusim.ops.column_tiles, npusim.ops.wide_rows)
    ("swiglu", {"shape": (2, 37888), "dtype": "bf16"}), ("swiglu", {"shape": (3, 2 * 100003), "dtype": "fp32"}),
    ("rms_norm", {"shape": (8, 200000)}), ("rms_norm", {"shape": (2, 16384)}), ("softmax", {"shape": (4, 40000)}),
    ("layer_norm", {"shape": (3, 16411), "dtype": "bf16"}), ("add_rms_norm", {"shape": (2, 16384), "dtype": "fp32"}),
    ("rope", {"shape": (1, 1, 64)}), ("rope", {"shape": (3, 8, 96)}), ("rope", {"shape": (8, 32, 128)}),
    ("rope", {"shape": (512, 64, 128)}), ("rope", {"shape": (8, 32, 128), "dtype": "bf16"}),
    ("argmax", {"shape": (1, 100)}), ("argmax", {"shape": (8, 64000)}), ("argmax", {"shape": (48, 64000)}),
    ("argmax", {"shape": (32, 151936), "dtype": "fp32"}),
    ("top_k", {"shape": (1, 100), "k": 5}), ("top_k", {"shape": (8, 64000)}),
    ("top_k", {"shape": (32, 151936), "k": 20}),
    ("trans_data", {"shape": (16, 16)}), ("trans_data", {"shape": (100, 200)}),
    ("trans_data", {"shape": (2, 300, 1000), "dtype": "fp32"}), ("trans_data", {"shape": (1024, 4096)}),
    ("trans_data", {"shape": (1024, 4096), "src_format": "NZ", "dst_format": "ND"}),
    ("trans_data", {"shape": (77, 4096), "dtype": "int8"}),
    *[("kv_cache_write", {"layout": lay, **kw}) for lay in ("per_layer", "contiguous", "paged") for kw in [
        {"batch": 1, "kv_heads": 1, "new_tokens": 1, "context": 16},
        {},
        {"batch": 12, "context": 8192},  # the contiguous cache of every layer: 48 GiB of 64
        {"batch": 1, "new_tokens": 1000, "position": 100},
        {"batch": 2, "kv_heads": 8, "head_dim": 80, "new_tokens": 300, "context": 1024},
    ]],
    ("embedding", {"tokens": 1}), ("embedding", {"tokens": 8}), ("embedding", {"tokens": 4096}),
    ("embedding", {"tokens": 100, "vocab": 151936, "hidden": 3584, "dtype": "bf16"}),
    ("embedding", {"tokens": 2048, "vocab": 1000, "hidden": 256}),  # more tokens than rows (a prefill gather)
]


def _id(case) -> str:
    op, kw = case
    return op + "-" + "-".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in kw.items())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_op_verifies_and_never_beats_its_roofline(case):
    op, params = case
    lowered = lower(op, params, HW)
    assert lowered.unit == "vector" and lowered.kernels
    assert lowered.min_gm_bytes == sum(t.nbytes for t in (*lowered.inputs, *lowered.outputs))
    report = simulate_op(lowered, HW, trace="kernel")  # runs verify() on every kernel
    assert report.seconds >= report.roofline.time_s
    # every byte the op must move was moved (burst rounding only adds)
    assert report.stats.gm_bytes >= lowered.min_gm_bytes


def test_every_op_type_is_registered():
    from npusim.ops.registry import OPS, spec

    spec("add")  # imports the package
    mine = {"add", "mul", "scale", "scale_add", "silu", "gelu", "swiglu", "cast", "relu", "rms_norm",
            "layer_norm", "softmax", "add_rms_norm", "rope", "trans_data", "kv_cache_write", "embedding",
            "argmax", "top_k", "sigmoid", "exp", "maximum"}
    assert mine <= set(OPS)
    assert {c[0] for c in CASES} == mine


# ------------------------------------------------------------------ bandwidth


def test_large_add_reaches_sustained_hbm_bandwidth():
    """256 MiB per input: the add streams at >= 80% of the sustained HBM bandwidth.

    Measured as HBM read + HBM write bytes over the time: what the HBM link carried.
    The HBM write count covers only the lines evicted during the run - the last
    ~L2-sized part of the output is still dirty in L2 when the kernel ends, so GM
    bytes / time (every input byte read once, every output byte written once) is
    also printed; it exceeds the HBM figure because those writes never waited for HBM."""
    n = 128 * 1024 * 1024  # fp16: 256 MiB per input
    lowered = lower("add", {"shape": (n,)}, HW)
    report = simulate_op(lowered, HW, trace="kernel")
    sustained = HW.hbm.peak_bw_bytes_per_s * HW.hbm.bw_efficiency
    s = report.stats
    hbm_frac = report.hbm_bw_bytes_per_s / sustained
    gm_frac = report.gm_bw_bytes_per_s / sustained
    print(f"\nadd 2 x 256 MiB fp16: {report.us:.1f} us (roofline {report.roofline.time_s * 1e6:.1f} us); "
          f"HBM read {s.hbm_read_bytes / 2**20:.0f} MiB + write {s.hbm_write_bytes / 2**20:.0f} MiB -> "
          f"{report.hbm_bw_bytes_per_s / 1e12:.3f} TB/s = {hbm_frac:.1%} of sustained {sustained / 1e12:.3f} TB/s; "
          f"GM bytes / time {report.gm_bw_bytes_per_s / 1e12:.3f} TB/s = {gm_frac:.1%}")
    assert s.hbm_read_bytes >= 2 * n * 2  # both inputs come from HBM once
    assert hbm_frac >= 0.8


# ------------------------------------------------------------------ layouts


def _kv(layout: str, **kw):
    lowered = lower("kv_cache_write", {"layout": layout, **kw}, HW)
    return simulate_op(lowered, HW, trace="kernel")


@pytest.mark.parametrize("shape", [
    {},  # decode: batch 8, one new token, 32 heads of 128
    {"batch": 1, "new_tokens": 1024},  # prefill
    {"batch": 4, "kv_heads": 8, "head_dim": 80, "new_tokens": 1},  # a head of 160 B: not burst-aligned
], ids=["decode", "prefill", "head80"])
def test_contiguous_kv_cache_has_fewer_segments_and_no_more_waste(shape):
    reports = {lay: _kv(lay, **shape) for lay in ("per_layer", "contiguous", "paged")}
    print()
    for lay, r in reports.items():
        s = r.stats
        print(f"kv_cache_write {shape or 'decode'} {lay:10s}: {s.dma_segments:6d} DMA segments, "
              f"{s.wasted_burst_bytes:8.0f} wasted burst bytes, {s.misaligned_segments:5d} misaligned, "
              f"{r.us:7.2f} us")
    c = reports["contiguous"].stats
    for other in ("per_layer", "paged"):
        o = reports[other].stats
        assert c.dma_segments < o.dma_segments, other
        assert c.wasted_burst_bytes <= o.wasted_burst_bytes, other
    # the paged layout also reads its block table: tiny reads, each a burst mostly wasted
    assert reports["paged"].stats.wasted_burst_bytes > reports["per_layer"].stats.wasted_burst_bytes


def test_paged_prefill_splits_runs_at_block_boundaries():
    """Tokens 100..1100 cross 8 block boundaries; the per-layer cache writes them as runs."""
    shape = {"batch": 1, "new_tokens": 1000, "position": 100}
    seg = {lay: _kv(lay, **shape).stats.dma_segments for lay in ("per_layer", "paged")}
    assert seg["paged"] > seg["per_layer"]


def _plain_copy(nbytes: int):
    gm = GmArena()
    x, y = gm.tensor("x", nbytes), gm.tensor("y", nbytes)
    e = DTYPE_BYTES["fp16"]

    def compute(nr, ub_in, ub_out, tmp, consts):
        return [VecOp("copy", nr, "fp16", ub_out[0], (ub_in[0],))]

    k = streaming_kernel("copy", "copy", HW, nbytes // e, [Stream(x, e)], [Stream(y, e)], compute,
                         quantum=HW.l2.line_bytes // e)
    from npusim.engine import simulate

    return simulate(k, HW, "kernel", mode="graph")


@pytest.mark.parametrize("shape", [(1024, 4096), (4, 256, 1000)])
def test_nd_to_nz_moves_more_segments_than_a_plain_copy(shape):
    lowered = lower("trans_data", {"shape": shape}, HW)
    report = simulate_op(lowered, HW, trace="kernel")
    copy = _plain_copy(lowered.inputs[0].nbytes)
    t, c = report.stats, copy.stats
    print(f"\ntrans_data ND->NZ {shape}: {t.dma_segments} segments, {t.wasted_burst_bytes:.0f} wasted, "
          f"{report.us:.2f} us; plain copy of the same bytes: {c.dma_segments} segments, "
          f"{c.wasted_burst_bytes:.0f} wasted, {copy.us:.2f} us")
    assert t.dma_segments > c.dma_segments


def test_nz_round_trip_moves_the_same_bytes_both_ways():
    there = simulate_op(lower("trans_data", {"shape": (512, 1024)}, HW), HW, trace="kernel")
    back = simulate_op(lower("trans_data", {"shape": (512, 1024), "src_format": "NZ", "dst_format": "ND"}, HW),
                       HW, trace="kernel")
    assert there.stats.gm_bytes == back.stats.gm_bytes
    assert there.stats.dma_segments == back.stats.dma_segments


def test_embedding_is_one_dma_per_row():
    tokens = 1000
    report = simulate_op(lower("embedding", {"tokens": tokens}, HW), HW, trace="kernel")
    # one gather per token, plus per core: its ids and one store per tile
    assert tokens <= report.stats.dma_segments < 2 * tokens


def test_fused_add_rms_norm_moves_less_than_add_then_rms_norm():
    shape = {"shape": (2048, 4096)}
    fused = lower("add_rms_norm", shape, HW)
    parts = [lower("add", shape, HW), lower("rms_norm", shape, HW)]
    assert fused.min_gm_bytes < sum(p.min_gm_bytes for p in parts)
    t_fused = simulate_op(fused, HW, trace="kernel").seconds
    t_parts = sum(simulate_op(p, HW, trace="kernel").seconds for p in parts)
    assert t_fused < t_parts


@pytest.mark.parametrize("op, params", [
    ("embedding", {"tokens": 960}),
    ("kv_cache_write", {"layout": "contiguous"}),
    ("trans_data", {"shape": (768, 1024)}),
    ("rms_norm", {"shape": (960, 4096)}),
])
def test_shared_block_programs_simulate_as_every_block_alone(op, params):
    """Tile kernels fold blocks that differ by constant steps into one Program, which
    the engine may run once for the group: the result must not change."""
    from kernels import simulate_on_device

    (kernel,) = lower(op, params, HW).kernels
    assert len({id(p) for p in kernel.aiv}) < kernel.block_dim  # some blocks do share a program
    grouped = simulate_on_device(kernel, HW, dedup=True, trace="kernel")
    alone = simulate_on_device(kernel, HW, dedup=False, trace="kernel")
    assert grouped.cycles == pytest.approx(alone.cycles, rel=1e-9)
    assert grouped.stats.dma_segments == alone.stats.dma_segments
    assert grouped.stats.gm_bytes == alone.stats.gm_bytes


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("op, params, names", [
    ("softmax", {"shape": (0, 5)}, "shape"),
    ("softmax", {"shape": (300000, 1000, 3), "dim": 1}, "2^19"),  # 1.8M tile loads: minutes
    ("add", {"shape": (8, -1)}, "shape"),
    ("rope", {"shape": (8, 128)}, "shape"),
    ("rope", {"shape": (8, 32, 40)}, "head_dim"),
    ("swiglu", {"shape": (8, 4097)}, "shape[-1]"),
    ("cast", {"shape": (8,), "dtype": "fp16", "out_dtype": "fp16"}, "out_dtype"),
    ("trans_data", {"shape": (4096,)}, "shape"),
    ("trans_data", {"shape": (16, 16), "src_format": "NZ", "dst_format": "NZ"}, "dst_format"),
    ("kv_cache_write", {"position": 4000, "new_tokens": 200}, "position"),
    ("kv_cache_write", {"layer": 32}, "layer"),
    ("kv_cache_write", {"head_dim": 8}, "head_dim"),
    ("kv_cache_write", {"layout": "ragged"}, "layout"),
    ("embedding", {"hidden": 100000}, "hidden"),
    ("top_k", {"shape": (8, 40), "k": 50}, "k=50"),
    ("argmax", {"shape": (8, 100003)}, "shape[-1]"),
    ("add", {"shape": "8x4096", "dtype": "fp8"}, "dtype"),
    ("exp", {"base": 0.0}, "base"),
    ("maximum", {"shape": (4, 5), "shape2": (2, 5)}, "(2, 5)"),
    ("maximum", {"shape": (4, 5), "shape2": (3, 4, 5)}, "(3, 4, 5)"),
    ("maximum", {"shape": (3, 4, 5), "shape2": (3, 1, 5)}, "(3, 1, 5)"),
    ("maximum", {"shape": (8, 7), "shape2": (8, 1), "dtype": "int64"}, "(8, 1)"),
    ("maximum", {"shape": (2, 300000), "shape2": (300000,), "dtype": "fp32"}, "(300000,)"),
])
def test_bad_shapes_are_one_line_errors(op, params, names):
    with pytest.raises(NpusimError) as err:
        lower(op, params, HW)
    msg = str(err.value)
    print(f"\n{op} {params}: {msg}")
    assert "\n" not in msg and op in msg and names in msg


# ------------------------------------------------------------------ sigmoid, exp, maximum

RNG = np.random.default_rng(0)


def _ref(op: str, params: dict, **x) -> np.ndarray:
    from npusim.ops import OPS

    p = OPS[op].params(**params)
    return OPS[op].reference(p, {k: v.astype(np.float32).reshape(-1) for k, v in x.items()}, {}, None)["y"]


def test_sigmoid_reference_is_the_logistic_function():
    x = RNG.normal(0, 4, (7, 33)).astype(np.float32)
    y = _ref("sigmoid", {"shape": (7, 33)}, x=x)
    assert np.allclose(y.reshape(x.shape), 0.5 * (1 + np.tanh(x / 2)), atol=1e-6)


@pytest.mark.parametrize("base, scale, shift", [(-1.0, 1.0, 0.0), (-1.0, 1.5, 0.0), (10.0, 1.0, 0.0),
                                                (2.0, 0.5, 1.0), (1.0, 2.0, 0.0)])
def test_exp_reference_is_base_to_the_power(base, scale, shift):
    x = RNG.uniform(-3, 3, (5, 17)).astype(np.float32)
    y = _ref("exp", {"shape": (5, 17), "base": base, "scale": scale, "shift": shift}, x=x)
    want = np.power(np.e if base == -1.0 else base, scale * x.astype(np.float64) + shift)
    assert np.allclose(y.reshape(x.shape), want, rtol=1e-5)


@pytest.mark.parametrize("shape, shape2", [((7, 33), ()), ((7, 33), (1, 33)), ((255, 17), (17,)),
                                           ((2, 3, 5, 16, 4), (1, 1, 1, 16, 1)), ((7, 33), (1,))])
def test_maximum_reference_broadcasts_x2(shape, shape2):
    x1 = RNG.normal(size=shape)
    x2 = RNG.normal(size=shape2 or shape)
    y = _ref("maximum", {"shape": shape, "shape2": shape2}, x1=x1, x2=x2)
    want = np.array([max(a, b) for a, b in zip(x1.ravel(), np.broadcast_to(x2, shape).ravel())])
    assert np.array_equal(y.reshape(-1), want.astype(np.float32))


@pytest.mark.parametrize("params, steps", [
    ({}, ["exp"]), ({"scale": 1.5}, ["muls", "exp"]), ({"base": 10.0}, ["muls", "exp"]),
    ({"shift": 1.0}, ["adds", "exp"]), ({"base": 2.0, "scale": 0.5, "shift": 1.0}, ["muls", "adds", "exp"]),
    ({"base": 1.0, "scale": 2.0}, ["muls", "exp"]),  # ln(1) = 0: one Muls by 0, no Adds of 0
])
def test_exp_issues_muls_and_adds_only_for_attributes_that_change_x(params, steps):
    (kernel,) = lower("exp", {"shape": (8, 4096), "dtype": "fp32", **params}, HW).kernels
    assert [v.op for v in _vec_ops(kernel.aiv[0].body)][:len(steps)] == steps
    assert {v.op for v in _vec_ops(kernel.aiv[0].body)} == set(steps)


def _vec_ops(body) -> list:
    from npusim.isa.program import Loop

    out = []
    for it in body:
        out += _vec_ops(it.body) if isinstance(it, Loop) else [it] if isinstance(it, VecOp) else []
    return out


@pytest.mark.parametrize("op, params", [
    ("sigmoid", {"dtype": "fp16"}), ("sigmoid", {"dtype": "bf16"}), ("exp", {"dtype": "fp32", "scale": 1.5}),
    ("maximum", {"dtype": "fp32"}), ("maximum", {"dtype": "int64"}),
    ("maximum", {"dtype": "fp32", "shape2": (1, 513)}),
])
def test_time_is_at_least_the_roofline_and_grows_with_size(op, params):
    times = []
    for rows in (512, 2048):
        lowered = lower(op, {"shape": (rows, 513), **params}, HW)
        report = simulate_op(lowered, HW, trace="kernel")
        hbm = (sum(t.nbytes for t in lowered.inputs) / (HW.hbm.peak_bw_bytes_per_s * HW.hbm.bw_efficiency))
        assert report.seconds >= report.roofline.time_s >= hbm  # every input byte comes from HBM at least once
        times.append(report.seconds)
    assert times[1] > times[0]


def test_broadcast_maximum_reads_fewer_gm_bytes_than_two_full_inputs():
    full = simulate_op(lower("maximum", {"shape": (2049, 513), "dtype": "fp32"}, HW), HW, trace="kernel")
    row = simulate_op(lower("maximum", {"shape": (2049, 513), "shape2": (1, 513), "dtype": "fp32"}, HW), HW,
                      trace="kernel")
    x1 = 2049 * 513 * 4
    # full: both inputs once; broadcast: x1 once, the row once per core at most
    assert full.stats.gm_read_bytes >= 2 * x1
    assert row.stats.gm_read_bytes < 2 * x1
    assert row.stats.gm_read_bytes - x1 <= HW.aiv_count * 513 * 4 + row.stats.wasted_burst_bytes


def test_int64_maximum_costs_more_vector_cycles_than_int32():
    v = {dt: simulate_op(lower("maximum", {"shape": (64, 4096), "dtype": dt}, HW), HW, trace="kernel")
         .stats.busy_cycles["AIV.V"] for dt in ("int32", "int64")}
    # no 64-bit ALU: compares and selects over twice the 32-bit words, against one Max
    assert v["int64"] > 2 * v["int32"]


def test_a_tile_body_shape_tells_apart_every_field_of_its_instructions():
    """compress folds tile bodies whose shapes (vector_kernels._shape) are equal: a Copy
    or VecOp differing in any field but where it points must give another shape (a
    field added to either record and left out of the shape would fold unequal tiles)."""
    import attrs

    from npusim.isa.program import Copy, Mem, VecOp
    from npusim.ops.vector_kernels import _shape

    addresses = {"src_addr", "dst_addr", "dst", "srcs"}
    other = {"src": Mem.L1, "dst": Mem.L1, "nbytes": 64, "segments": 2, "src_stride": 64, "dst_stride": 64,
             "convert": "nd2nz", "op": "mul", "n": 128, "dtype": "fp32", "out_dtype": "fp32", "out_n": 1,
             "flops_per_elem": 2, "scalar": 2.0, "scalar_src": 32, "pitches": ((2, 0, 0),)}
    for base in (Copy(Mem.GM, Mem.UB, 0, 0, 32), VecOp("add", 64, "fp16", 0, (0, 64))):
        for f in attrs.fields(base.__class__):
            if f.name in addresses:
                continue
            changed = attrs.evolve(base, **{f.name: other[f.name]})
            assert _shape([changed])[0] != _shape([base])[0], f"{base.__class__.__name__}.{f.name}"


@pytest.mark.parametrize("rows, cols, dtype, shape, tiles", [
    (1024, 1024, "fp16", (19, 512), 108),  # x [1024, 2048]: colLen cut into whole 512-byte runs
    (273, 509, "fp32", (18, 384), 32),  # x [273, 1018]: 32 tiles on 32 cores (rows alone: 7 on 40)
    (1375, 50, "fp32", (125, 50), 11),  # rows of 50: whole rows, 125 to a tile
])
def test_swiglu_tiles_as_canns_host_tiling(rows, cols, dtype, shape, tiles):
    """npusim.ops.swiglu_tiles ports CANN's SwiGlu host tiling (swi_glu_tiling.cpp) over
    rowLen x colLen (half of x's last dim): base tiles sized from UB, columns cut into whole
    512-byte runs when that gives fewer tiles (worked by hand from its source)."""
    from npusim.ops.swiglu_tiles import swiglu_tiling

    t = swiglu_tiling(HW, rows, cols, dtype)
    assert (t.base_rows, t.base_cols, t.tiles) == (*shape, tiles)


@pytest.mark.parametrize("shape, dtype", [((65536, 8448), "fp16"), ((4099, 4224), "fp32"), ((511, 8192), "bf16"),
                                          ((2048, 14336), "fp16")])
def test_swiglu_lowers_alike_tiles_to_the_program_every_tile_built_gives(shape, dtype, monkeypatch):
    """swiglu_tiles vouches for its whole-row tiles (tile_pipeline's `alike`), so only a
    few of them are built: the programs must equal those of every tile built and folded."""
    from npusim.ops import layout

    quick = lower("swiglu", {"shape": shape, "dtype": dtype}, HW).kernels[0]
    every = layout.tile_pipeline
    monkeypatch.setattr(layout, "tile_pipeline", lambda tiles, direct, period, alike: every(tiles, direct, period))
    full = lower("swiglu", {"shape": shape, "dtype": dtype}, HW).kernels[0]
    assert quick.block_dim == full.block_dim and quick.aiv == full.aiv


def test_tile_pipeline_refuses_tiles_wrongly_vouched_alike():
    """A caller's `alike` that the runs it builds contradict (here the last vouched run
    points elsewhere) is an error, not a program that runs other tiles than those asked for."""
    from npusim.isa.program import Copy, Mem
    from npusim.ops.vector_kernels import tile_pipeline

    def tile(addr):
        return lambda p: ([Copy(Mem.GM, Mem.UB, addr, p * 4096, 64)], [], [Copy(Mem.UB, Mem.GM, p * 4096, addr, 64)])

    steady = [tile(64 * i) for i in range(8)]
    assert tile_pipeline(steady, alike=8) == tile_pipeline(steady)
    with pytest.raises(ValueError, match="not runs"):
        tile_pipeline(steady[:6] + [tile(1 << 20)] + steady[7:], alike=8)


@pytest.mark.parametrize(("dtype", "out_dtype"), [("fp32", "int8"), ("fp16", "int32"), ("bf16", "int8")])
def test_check_of_a_cast_to_an_integer_passes(dtype, out_dtype):
    """The reference kept x's fractions (0.947 where y holds 0), so --check printed FAIL
    for every float-to-integer cast; it now keeps the integer part, as the conversion does."""
    from npusim.passes.validate_kernels import check_op

    r = check_op("cast", {"shape": (3, 7), "dtype": dtype, "out_dtype": out_dtype}, HW)
    assert (r.status, r.max_abs) == ("pass", 0.0)
