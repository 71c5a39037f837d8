"""GroupedMatmul on the cube (CANN's GroupedMatmul): the expert GEMMs of an MoE layer.

x [M, K] holds E groups of consecutive rows (`group_sizes`, in order; a group may be
empty), weight [E, K, N] (or [E, N, K] with trans_b) one matrix per group (its
expert), bias [E, N] an optional row per expert; y [M, N] is each group's rows times
its own weight (+ its bias row).

One AIC kernel. Its work units are the (group, m tile, n tile) of every group, in
that order, dealt to the cores as the dense matmul deals its tiles: contiguous runs
of cdiv(units, cores). A unit is the dense matmul's tile program
(npusim.ops.matmul_program: K streamed through L1 chunks and L0 slices in
ping-pong, FixPipe to GM) with its group's rows, expert weight and bias row as base
addresses. An empty group has no units, so its expert's weight is never read. A
group's tiles are as tall as it needs, up to base_m (the largest group's), so
groups of a few tokens (decode) use tiles down to one fractal (16 rows). K is not
split: a unit is a whole tile.

W8A16 (weight_dtype=int8, the quantize pass's experts): the weight is int8 with an
fp32 scale per expert and output channel, scale [E, N]; as in the dense matmul's
W8A16 path, B moves as int8 (half the bytes), MTE1 widens it to fp16 into L0B and
FixPipe multiplies each tile by its expert's scales (a unit's scale row is its
expert's, as its bias row is).

The group sizes are known when the op is lowered (a static tiling, as for every op
here); the few bytes of CANN's group_list tensor are not read by the kernel. A graph
may bind it (a MoE layer does): the numpy reference then splits rows by its values.
"""

from __future__ import annotations

import itertools

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.hw.derived import mmad_fractal
from npusim.isa.program import DTYPE_BYTES, CoreType, Kernel, Program
from npusim.ops.build import align_up, boxes, cdiv
from npusim.ops.matmul import MatmulParams, MatmulTiling, alloc_plan, check_tiling, refuse_work
from npusim.ops.matmul_program import _b_dtype, _box, _epilogue, _Layout, _Plan, _prologue
from npusim.ops.matmul_tiling import MAX_BASE_M, STEP_K, panel_fits, slice_depth, tile_widths, unit_cycles
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register

_DTYPES = ("fp16", "bf16")
_pos = validators.gt(0)


def _group_sizes_validator(instance, attribute, value) -> None:
    """Row counts >= 0, at least one group with rows."""
    if not value or not all(isinstance(g, int) and g >= 0 for g in value) or not sum(value):
        raise ValueError(f"'{attribute.name}' must be row counts >= 0 of at least one non-empty group, got {value!r}")


@frozen
class GroupedMatmulParams:
    group_sizes: tuple[int, ...] = param((256, 256, 256, 256), "rows of x in each group (expert), in order; "
                                         "0 = an empty group", converter=tuple, validator=_group_sizes_validator)
    k: int = param(1024, "reduction length", validator=_pos)
    n: int = param(1024, "columns of each weight and of y", validator=_pos)
    dtype: str = param("fp16", "dtype of x and weight", validator=validators.in_(_DTYPES))
    trans_b: bool = param(False, "weights stored as [E, n, k] (Linear weights) instead of [E, k, n]")
    bias: str = param("", "dtype of a bias [E, n], a row per expert: empty = none, fp32 or the dtype",
                      validator=validators.in_(("", *_DTYPES, "fp32")))
    out_dtype: str = param("", "dtype of y: empty = dtype", validator=validators.in_(("", *_DTYPES, "fp32")))
    weight_dtype: str = param("", "dtype of the weight in GM: empty = dtype; int8 = W8A16 with an fp32 scale "
                              "per expert and output channel (scale [E, n])", validator=validators.in_(("", "int8")))

    def __attrs_post_init__(self):
        if self.bias not in ("", "fp32", self.dtype):
            raise ValueError(f"bias={self.bias} with dtype={self.dtype}: a bias is fp32 or the dtype")

    @property
    def m(self) -> int:
        """Rows of x and y: every group's."""
        return sum(self.group_sizes)

    @property
    def y_dtype(self) -> str:
        return self.out_dtype or self.dtype


def _group_params(p: GroupedMatmulParams, rows: int) -> MatmulParams:
    """One group as a dense matmul: what its tile program is built from."""
    return MatmulParams(m=rows, n=p.n, k=p.k, dtype=p.dtype, out_dtype=p.y_dtype, bias=bool(p.bias),
                        trans_b=p.trans_b, weight_dtype=p.weight_dtype)


def _group_base_m(rows: int, base_m: int, m0: int) -> int:
    """A group's tile height: as many fractal rows as it has rows, up to base_m."""
    return min(base_m, align_up(rows, m0))


def _busiest_core(runs: list[tuple[int, float]], cores: int) -> float:
    """Cycles of the busiest core when the units - runs of (count, cycles each), in
    order - are dealt to the cores in contiguous runs of cdiv(units, cores)."""
    per_core = cdiv(sum(count for count, _ in runs), cores)
    worst = core = 0.0
    room = per_core
    for count, cycles in runs:
        while count:
            take = min(count, room)
            core += take * cycles
            count -= take
            room -= take
            if not room:
                worst, core, room = max(worst, core), 0.0, per_core
    return max(worst, core)


def choose_grouped_tiling(p: GroupedMatmulParams, hw: HwConfig) -> MatmulTiling:
    """choose_tiling's cost model over the groups' units: base_m fits the largest group
    (each group's tiles as tall as it needs), base_n is the width whose busiest core
    (its run of units, each costing unit_cycles) finishes first - narrower tiles until
    the units fill the cores. An empty group has no units and costs nothing."""
    cores = hw.chip.aic_count
    f = mmad_fractal(hw, p.dtype)
    e, eb = DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.weight_dtype or p.dtype]
    base_k = slice_depth(hw, p.dtype)
    base_m = _group_base_m(max(p.group_sizes), MAX_BASE_M, f.m0)
    groups = [(rows, _group_base_m(rows, base_m, f.m0)) for rows in p.group_sizes if rows]
    best = None
    for base_n in tile_widths(p.n, f):
        runs = [(cdiv(rows, bm) * cdiv(p.n, base_n), unit_cycles(hw, f, bm, base_n, p.k, base_k, e, eb))
                for rows, bm in groups]
        cost = _busiest_core(runs, cores)
        if best is None or cost < best[0]:
            best = (cost, base_n, sum(count for count, _ in runs))
    _, base_n, units = best
    return MatmulTiling(base_m=base_m, base_n=base_n, base_k=base_k, step_k=STEP_K, split_k=1,
                        a_resident=cdiv(p.n, base_n) > 1 and panel_fits(base_m, p.k, e, hw),
                        block_dim=min(cores, units))


def reference_grouped_matmul(p: GroupedMatmulParams, x, specs, ctx) -> dict:
    """y[rows of group g] = x[rows of g] @ weight[g] (+ bias[g]), in fp32, group by group;
    an int8 weight (W8A16) is multiplied as its integers, then each column by its
    expert's scale (FixPipe), before the bias.
    With a `group_list` operand (a MoE layer's row counts per expert, from
    moe_init_routing) its values split the rows: the router's choices in a numpy run,
    where group_sizes are the timing run's drawn counts (npusim.graph.routing)."""
    experts = len(p.group_sizes)
    sizes = p.group_sizes
    if "group_list" in x:
        sizes = tuple(int(g) for g in x["group_list"].reshape(-1))
        if len(sizes) == experts and sum(sizes) > p.m:  # the graph was built with rows dropped (capacity_factor)
            raise ValueError(f"group_list routes {sum(sizes)} rows, group_sizes keep {p.m}: a capacity cap's drops "
                             "are timed but not computed by numpy runs (check with capacity_factor 0)")
        if len(sizes) != experts or sum(sizes) != p.m:
            raise ValueError(f"group_list {sizes} does not split the {p.m} rows over {experts} groups")
    a = x["x"].reshape(p.m, p.k)
    w = x["weight"].reshape(experts, p.n, p.k).transpose(0, 2, 1) if p.trans_b else x["weight"].reshape(
        experts, p.k, p.n)
    bias = x["bias"].reshape(experts, p.n) if p.bias else None
    scale = x["scale"].reshape(experts, p.n) if p.weight_dtype == "int8" else None
    y = np.zeros((p.m, p.n), np.float32)
    for g, (lo, hi) in enumerate(itertools.pairwise(np.cumsum((0, *sizes)))):
        y[lo:hi] = a[lo:hi] @ w[g]
        if scale is not None:
            y[lo:hi] *= scale[g]
        if bias is not None:
            y[lo:hi] += bias[g]
    return {"y": y}


@register("grouped_matmul", GroupedMatmulParams, MatmulTiling, choose_grouped_tiling,
          reference=reference_grouped_matmul, ins=("x", "weight", "bias", "scale", "group_list"), outs=("y",))
def lower_grouped_matmul(p: GroupedMatmulParams, hw: HwConfig, gm: GmArena, tiling: MatmulTiling | None) -> Lowered:
    """Grouped matrix multiply on the cube (MoE experts): each group's rows of x times its own weight."""
    op = "grouped_matmul"
    t = tiling or choose_grouped_tiling(p, hw)
    cores = check_tiling(t, p.dtype, hw, op)
    if t.split_k != 1:
        raise ProgramError(f"op {op}: tiling split_k={t.split_k}: a grouped matmul does not split K "
                           "(its units are whole tiles)")
    experts = len(p.group_sizes)
    wdt = _b_dtype(p)
    e, eb, eo, be = DTYPE_BYTES[p.dtype], DTYPE_BYTES[wdt], DTYPE_BYTES[p.y_dtype], DTYPE_BYTES[p.bias or "fp32"]
    se = DTYPE_BYTES["fp32"]  # a W8A16 scale: fp32, as the dense matmul's
    X = gm.tensor("x", p.m * p.k * e)
    W = gm.tensor("weight", experts * p.k * p.n * eb)
    Y = gm.tensor("y", p.m * p.n * eo)
    bias = gm.tensor("bias", experts * p.n * be) if p.bias else None
    scale = gm.tensor("scale", experts * p.n * se) if wdt == "int8" else None
    la = _Layout(X, p.m, p.k, e, "ND")
    lb = _Layout(W, p.k, p.n, eb, "ND", p.trans_b)
    lc = _Layout(Y, p.m, p.n, eo, "ND")
    plan, buf = alloc_plan(_group_params(p, max(p.group_sizes)), t, hw, op, la, lb, (lc,), ((0, p.n),),
                           align_up(p.k, t.base_k), bias, scale, be)

    groups = _group_nests(p, plan, mmad_fractal(hw, p.dtype).m0)
    units = sum(dims[1] * dims[2] for _, _, dims in groups)
    refuse_work(units * cdiv(p.k, t.base_k * t.step_k),  # each unit streams all of K (not split)
                f"group_sizes of {p.m} rows x n={p.n} x k={p.k}", t, op)
    per_core = cdiv(units, cores)
    programs = [Program(_prologue(t) + _core_body(groups, lo, min(units, lo + per_core)) + _epilogue(t), buf.buffers)
                for lo in range(0, units, per_core)]
    kernel = Kernel(op, CoreType.AIC, len(programs), aic=programs,
                    gm=[x for x in (X, W, Y, bias, scale) if x is not None], op_type=op)
    ins = [TensorInfo("x", (p.m, p.k), p.dtype),
           TensorInfo("weight", (experts, p.n, p.k) if p.trans_b else (experts, p.k, p.n), wdt)]
    if p.bias:
        ins.append(TensorInfo("bias", (experts, p.n), p.bias))
    if scale is not None:
        ins.append(TensorInfo("scale", (experts, p.n), "fp32"))
    outs = [TensorInfo("y", (p.m, p.n), p.y_dtype)]
    used = sum(1 for g in p.group_sizes if g)  # experts whose weight (and bias and scale rows) is read
    per_expert = p.k * p.n * eb + (p.n * be if p.bias else 0) + (p.n * se if scale is not None else 0)
    return Lowered(
        op_type=op, params=p, tiling=attrs.evolve(t, block_dim=len(programs)), kernels=[kernel],
        flops=2.0 * p.m * p.n * p.k,
        min_gm_bytes=ins[0].nbytes + used * per_expert + outs[0].nbytes,
        unit="cube", inputs=ins, outputs=outs,
    )


def _group_nests(p: GroupedMatmulParams, plan: _Plan, m0: int) -> list[tuple[int, _Plan, tuple]]:
    """(first unit, plan, unit grid) of each non-empty group: the shared plan with the
    group's rows of x and y, its expert's weight, bias and scale rows as bases, and its tile height."""
    out = []
    first = 0
    for g, (row, rows) in enumerate(zip(itertools.accumulate(p.group_sizes, initial=0), p.group_sizes)):
        if not rows:
            continue
        t = attrs.evolve(plan.t, base_m=_group_base_m(rows, plan.t.base_m, m0))
        bias = plan.bias and attrs.evolve(plan.bias, addr=plan.bias.addr + g * p.n * plan.bias_elem)
        scale = plan.scale and attrs.evolve(plan.scale, addr=plan.scale.addr + g * p.n * DTYPE_BYTES["fp32"])
        group = attrs.evolve(plan, p=_group_params(p, rows), t=t, bias=bias, scale=scale,
                             la=plan.la.moved(row * plan.la.dr), lb=plan.lb.moved(g * plan.lb.batch_bytes),
                             lc=(plan.lc[0].moved(row * plan.lc[0].dr),))
        dims = (1, cdiv(rows, t.base_m), cdiv(p.n, t.base_n), 1)
        out.append((first, group, dims))
        first += dims[1] * dims[2]
    return out


def _core_body(groups: list[tuple[int, _Plan, tuple]], lo: int, hi: int) -> list:
    """The loop nests of the units [lo, hi): per group it reaches, the boxes of its grid."""
    body: list = []
    for first, plan, dims in groups:
        a, b = max(lo, first), min(hi, first + dims[1] * dims[2])
        for start, extent in boxes(a - first, b - first, dims):
            body += _box(plan, start, extent, dims)
    return body
