"""GroupedMatmul (MoE expert GEMMs): the numpy reference is a per-group matmul, one
group costs what the dense matmul does, an empty group reads none of its expert's
weights, small groups pay for their experts' weights, and every kernel verifies."""

import attrs
import numpy as np
import pytest

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.isa.program import Copy, Loop, Mem
from npusim.isa.verify import verify
from npusim.ops import OPS, lower, simulate_op
from npusim.ops.matmul_tiling import balanced_base_m
from npusim.ops.reference import RefContext

HW = load_hw("ascend910b2")
CTX = RefContext((1,), "prefill", lambda x, dtype: np.asarray(x, dtype=np.float32))


def _sim(op: str, params: dict):
    return simulate_op(lower(op, params, HW), HW, trace="kernel")  # runs verify() on every kernel


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("bias", ["", "fp32"])
def test_reference_is_each_group_times_its_expert(trans_b, bias):
    """Against a row-by-row loop: row i belongs to the group its index falls in."""
    sizes, k, n = (3, 0, 5, 1), 6, 4
    rng = np.random.default_rng(1)
    x = rng.standard_normal((sum(sizes), k), np.float32)
    w = rng.standard_normal((len(sizes), n, k) if trans_b else (len(sizes), k, n), np.float32)
    b = rng.standard_normal((len(sizes), n), np.float32)
    p = OPS["grouped_matmul"].params(group_sizes=sizes, k=k, n=n, trans_b=trans_b, bias=bias)
    y = OPS["grouped_matmul"].reference(p, {"x": x, "weight": w, "bias": b}, {}, CTX)["y"]
    expert = np.repeat(np.arange(len(sizes)), sizes)
    for i in range(sum(sizes)):
        wi = w[expert[i]].T if trans_b else w[expert[i]]
        want = x[i].astype(np.float64) @ wi + (b[expert[i]] if bias else 0)
        np.testing.assert_allclose(y[i], want, rtol=1e-5, atol=1e-5)
    assert y.shape == (sum(sizes), n) and y.dtype == np.float32


@pytest.mark.parametrize(("grouped", "dense"), [
    (dict(group_sizes=(1024,), k=1024, n=1024), dict(m=1024, n=1024, k=1024)),
    (dict(group_sizes=(256,), k=1024, n=4096, trans_b=True), dict(m=256, n=4096, k=1024, trans_b=True)),
    (dict(group_sizes=(2048,), k=512, n=1024, dtype="bf16", bias="fp32"),
     dict(m=2048, n=1024, k=512, dtype="bf16", out_dtype="bf16", bias=True)),
])
def test_one_group_costs_the_dense_matmul(grouped, dense):
    """On the same tiles, one group is the dense matmul. The two choosers may pick
    different widths: choose_tiling takes max(per-core cost, every byte of A, B and C
    over the sustained HBM rate), so the tilings under that floor tie and the widest
    wins; choose_grouped_tiling has no floor and takes the busiest core's cost. So the
    dense matmul runs on the grouped op's tiling."""
    g = _sim("grouped_matmul", grouped)
    chosen = lower("matmul", dense, HW).tiling
    assert chosen.split_k == 1  # the dense matmul does not split K here either
    assert (chosen.base_k, chosen.step_k) == (g.lowered.tiling.base_k, g.lowered.tiling.step_k)
    # the dense chooser's rows are the grouped op's, unless MatMulV3's load balancing cut them
    # (1024^3: 96-row tiles, 44 of them in two rounds of the 24 cores); GroupedMatmul does not
    dense_p = OPS["matmul"].params(**dense)
    assert chosen.base_m == balanced_base_m(dense_p, HW, g.lowered.tiling.base_m, chosen.base_n, 1)
    d = simulate_op(lower("matmul", dense, HW, tiling=attrs.asdict(g.lowered.tiling)), HW, trace="kernel")
    assert d.lowered.tiling == g.lowered.tiling
    print(f"\n{grouped}: grouped {g.us:.2f} us, dense {d.us:.2f} us (dense chooser: base_n {chosen.base_n})")
    assert g.us == pytest.approx(d.us, rel=0.01)
    assert g.stats.hbm_read_bytes == pytest.approx(d.stats.hbm_read_bytes, rel=0.01)
    assert g.lowered.flops == d.lowered.flops


def test_an_empty_group_reads_none_of_its_experts_weight():
    """Same rows of x, one expert fewer with tokens: HBM reads drop by one expert's weight."""
    k, n = 1024, 512
    expert = k * n * 2
    full = _sim("grouped_matmul", dict(group_sizes=(128, 64, 64), k=k, n=n))
    empty = _sim("grouped_matmul", dict(group_sizes=(128, 0, 128), k=k, n=n))
    two = _sim("grouped_matmul", dict(group_sizes=(128, 128), k=k, n=n))  # as if the empty expert did not exist
    print(f"\nHBM reads: 3 experts used {full.stats.hbm_read_bytes / 2**20:.3f} MiB, "
          f"one empty {empty.stats.hbm_read_bytes / 2**20:.3f} MiB (one expert = {expert / 2**20:.3f} MiB)")
    assert full.stats.hbm_read_bytes - empty.stats.hbm_read_bytes == pytest.approx(expert, rel=0.01)
    assert full.lowered.min_gm_bytes - empty.lowered.min_gm_bytes == expert
    assert empty.stats.hbm_read_bytes == pytest.approx(two.stats.hbm_read_bytes, rel=0.01)
    assert empty.us == pytest.approx(two.us, rel=0.01)  # an empty group costs nothing


def test_small_groups_pay_for_every_experts_weight():
    """8 experts x 32 tokens against one 256-token GEMM: the same FLOPs, 8x the weights."""
    k, n = 1024, 1024
    grouped = _sim("grouped_matmul", dict(group_sizes=(32,) * 8, k=k, n=n))
    dense = _sim("matmul", dict(m=256, n=n, k=k))
    print(f"\n8 x 32 rows: grouped {grouped.us:.2f} us, dense 256 rows {dense.us:.2f} us")
    assert grouped.lowered.flops == dense.lowered.flops
    assert grouped.stats.hbm_read_bytes >= 8 * k * n * 2
    assert grouped.stats.hbm_read_bytes > 4 * dense.stats.hbm_read_bytes
    assert grouped.us > 1.5 * dense.us


def _gm_copies(body, env: dict):
    """Every GM copy of a program in program order, loops unrolled: (reads GM, tensor
    offset of each segment, bytes per segment)."""
    for x in body:
        if isinstance(x, Loop):
            for i in range(x.count):
                yield from _gm_copies(x.body, {**env, x.var: i})
        elif isinstance(x, Copy) and Mem.GM in (x.src, x.dst):
            read = x.src is Mem.GM
            a, stride = (x.src_addr, x.src_stride) if read else (x.dst_addr, x.dst_stride)
            a = a if isinstance(a, int) else a.at(env)
            yield read, [a + i * (stride or x.nbytes) for i in range(x.segments)], x.nbytes


@pytest.mark.parametrize("trans_b", [False, True])
def test_each_tile_reads_its_groups_rows_and_expert_and_writes_its_rows(trans_b):
    """Walking every block's program: between two FixPipe writes of y (one tile), the
    weight bytes read are all in the expert of the group whose rows of y are written,
    and the x rows read are that group's; every y byte is written exactly once, every
    x byte and every used expert's weight and bias read, the empty expert's never."""
    sizes, k, n, e = (20, 0, 37, 5), 96, 80, 2
    low = lower("grouped_matmul", dict(group_sizes=sizes, k=k, n=n, trans_b=trans_b, bias="fp16"), HW,
                tiling=dict(base_m=16, base_n=32, base_k=32, step_k=1, a_resident=False))
    kernel = low.kernels[0]
    gm = {t.name: t for t in kernel.gm}
    edges = np.cumsum((0, *sizes))
    group_of_row = np.repeat(np.arange(len(sizes)), sizes)
    touched = {name: np.zeros(t.nbytes, int) for name, t in gm.items()}
    for block, prog in enumerate(kernel.aic):
        experts, rows = set(), set()
        for read, starts, nbytes in _gm_copies(prog.body, {"block": block}):
            for a in starts:
                name = next(t for t in gm if gm[t].addr <= a < gm[t].addr + gm[t].nbytes)
                off = a - gm[name].addr
                touched[name][off:off + nbytes] += 1
                assert off + nbytes <= gm[name].nbytes and read == (name != "y")
                if name == "weight":
                    experts.add(off // (k * n * e))
                elif name == "x":
                    rows.add(off // (k * e))
                elif name == "y":  # a FixPipe write: the tile's reads since the last one are its own
                    g = group_of_row[off // (n * e)]
                    assert experts <= {g} and {group_of_row[r] for r in rows} <= {g}
                    experts, rows = set(), set()
    assert (touched["y"] == 1).all() and (touched["x"] >= 1).all()
    for g, (lo, hi) in enumerate(zip(edges, edges[1:])):
        w, b = touched["weight"][g * k * n * e:(g + 1) * k * n * e], touched["bias"][g * n * e:(g + 1) * n * e]
        assert (w >= 1).all() and (b >= 1).all() if hi > lo else not w.any() and not b.any()


def test_small_groups_get_short_tiles_that_fill_the_cores():
    t = lower("grouped_matmul", dict(group_sizes=(5, 0, 9, 16, 3), k=512, n=2048), HW).tiling
    assert t.base_m == 16 and t.block_dim == HW.chip.aic_count
    t = lower("grouped_matmul", dict(group_sizes=(1000, 40), k=512, n=1024), HW).tiling
    assert t.base_m == 128  # the largest group's; the 40-row group uses 48-row tiles


GRID = [
    dict(group_sizes=(253, 252, 252, 252), k=1024, n=1024),
    dict(group_sizes=(32,) * 8, k=512, n=1024, dtype="bf16"),
    dict(group_sizes=(0, 1, 0, 17, 200, 0), k=300, n=100, bias="fp16", out_dtype="fp32"),
    dict(group_sizes=(3, 129, 64), k=4099, n=1000, trans_b=True, bias="fp32"),
    dict(group_sizes=(0, 0, 7), k=16, n=16),
    dict(group_sizes=(0, 9, 40, 0, 3), k=320, n=96, trans_b=True, weight_dtype="int8", bias="fp32"),  # W8A16
]


@pytest.mark.parametrize("params", GRID, ids=str)
def test_kernels_verify_and_never_beat_the_roofline(params):
    r = _sim("grouped_matmul", params)
    assert r.seconds >= r.roofline.time_s
    assert r.stats.flops == pytest.approx(r.lowered.flops)  # the Mmads do exactly the op's FLOPs
    assert r.stats.gm_write_bytes >= r.lowered.outputs[0].nbytes


def test_a_forced_tiling_is_used_and_verifies():
    low = lower("grouped_matmul", dict(group_sizes=(100, 0, 60), k=256, n=512), HW,
                tiling=dict(base_m=64, base_n=128, l0_double=False))
    assert (low.tiling.base_m, low.tiling.base_n, low.tiling.l0_double) == (64, 128, False)
    for k in low.kernels:
        verify(k, HW)


@pytest.mark.parametrize(("params", "tiling", "error", "message"), [
    (dict(group_sizes=()), None, ConfigError, r"'group_sizes' must be row counts >= 0 of at least one non-empty"),
    (dict(group_sizes=(0, 0)), None, ConfigError, r"'group_sizes' must be row counts"),
    (dict(group_sizes="4,-1"), None, ConfigError, r"'group_sizes' must be row counts"),
    (dict(bias="bf16"), None, ConfigError, r"bias=bf16 with dtype=fp16: a bias is fp32 or the dtype"),
    (dict(dtype="int8"), None, ConfigError, r"'dtype' must be in"),
    (dict(), dict(split_k=2), ProgramError, r"split_k=2: a grouped matmul does not split K"),
    (dict(), dict(base_n=100), ProgramError, r"base_n=100 is not a multiple of the fp16 fractal"),
])
def test_bad_inputs_fail_in_one_line(params, tiling, error, message):
    with pytest.raises(error, match=message) as e:
        lower("grouped_matmul", params, HW, tiling=tiling)
    assert "\n" not in str(e.value)
