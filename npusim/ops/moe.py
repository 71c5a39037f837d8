"""Mixture-of-experts routing on the vector cores (AIV): the router's gating, the
token permutation into expert order and its weighted inverse - what CANN's
MoeGatingTopKSoftmax, MoeInitRouting and MoeFinalizeRouting do. The expert GEMMs
between them are npusim.ops.grouped_matmul; the router's logits a plain matmul.

A MoE layer (npusim.graph.blocks builds it), for `tokens` tokens, E experts, top k:

    logits [tokens, E]     = matmul(x, router weight)
    moe_gating:              logits -> weights [tokens, k] (fp32), ids [tokens, k] (int32)
    moe_init_routing:        x, ids -> rows [tokens*k, h] in expert order,
                                       row_map [tokens*k], group_list [E]
    grouped_matmul gate, up -> silu, mul -> grouped_matmul down      (over rows)
    moe_finalize_routing:    rows, row_map, weights (+ residual) (+ shared) -> y [tokens, h]

row_map[t*k + j] is the row of `rows` that holds token t's copy for its j-th expert
(CANN's expanded_row_idx): init routing scatters x through it, finalize gathers back
through it. Within an expert, rows keep token order (a stable sort by expert id).
group_list[e] is expert e's row count (what grouped_matmul's numpy reference splits
its rows by).

Timing: where a row goes is data the lowering does not have. These kernels move the
same rows with the same DMAs (one per row) whatever the ids, so their cost follows
the counts only; the routing changes cost in the grouped matmul (which experts have
rows, how many), whose group sizes the graph builder draws (npusim.graph.routing).
(see npusim.ops.vector for the conventions every vector op follows)
"""

from __future__ import annotations

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.errors import ConfigError, ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Copy, Loop, Mem, Pipe, SetFlag, WaitFlag, addr
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv
from npusim.ops.layout import UB_RESERVE, split_runs
from npusim.ops.reference import softmax_rows
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.sampling import _merge_ops
from npusim.ops.vector import (
    UB_BLOCK, cast, dtype_validator, one_of, per_row, scalar_read, sigmoid, sigmoid_ops, vector_lowered, vop,
)
from npusim.ops.vector_kernels import (
    Stream, compress, pipeline_epilogue, pipeline_prologue, streaming_kernel, tile_kernel, tile_pipeline,
)

_pos = validators.gt(0)
SCORINGS = ("softmax", "sigmoid")
# A flag id free of the tile pipeline's ping (0) and pong (1): orders a kernel's
# head and tail work (per-core tables) around the pipeline.
_SIDE_FLAG = 2


def _k_validator(instance, attribute, value) -> None:
    if value > instance.experts:
        raise ValueError(f"'k' (experts per token) {value} is more than 'experts' {instance.experts}")


# ================================================================ gating


@frozen
class MoeGatingParams:
    tokens: int = param(8, "tokens routed (rows of the router's logits)", validator=_pos)
    experts: int = param(128, "experts (columns of the logits)", validator=_pos)
    k: int = param(8, "experts kept per token (top-k)", validator=[_pos, _k_validator])
    dtype: str = param("bf16", "dtype of the logits", validator=dtype_validator())
    scoring: str = param("softmax", "scores from logits: softmax over the experts, or sigmoid",
                         validator=one_of(SCORINGS))
    norm_topk: bool = param(True, "divide the k kept scores by their sum")


def gating(p: MoeGatingParams, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weights [tokens, k] fp32, ids [tokens, k]): each token's k best scores and their
    experts, best first (ties to the lower expert id), renormalised if norm_topk."""
    x = logits.reshape(p.tokens, p.experts).astype(np.float32)
    scores = softmax_rows(x) if p.scoring == "softmax" else sigmoid(x)
    ids = np.argsort(-scores, axis=-1, kind="stable")[:, :p.k]
    w = np.take_along_axis(scores, ids, axis=-1)
    if p.norm_topk:
        w = w / np.sum(w, axis=-1, keepdims=True)
    return w, ids


def reference_moe_gating(p: MoeGatingParams, x, specs, ctx) -> dict:
    w, ids = gating(p, x["logits"])
    return {"weights": w, "ids": ids.astype(np.int32)}


@register("moe_gating", MoeGatingParams, reference=reference_moe_gating, ins=("logits",), outs=("weights", "ids"))
def lower_moe_gating(p: MoeGatingParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """MoE router gating: softmax or sigmoid of the logits, top-k experts per token, renormalised weights."""
    # Per row, in fp32: the scores (softmax: max, subtract, exp, sum, scale), then
    # Sort32 over (score, expert index) pairs and 4-way merges down to the best k
    # (as top_k's chunk sort), the k weights and ids gathered out of the pairs, and
    # (norm_topk) a sum and a scale. The padding of a row to 32 bytes is sorted too
    # (# assumption: filled with -inf by the Duplicate that makes the indices).
    e = DTYPE_BYTES[p.dtype]
    ep = align_up(p.experts * 4, UB_BLOCK) // 4  # a row of fp32 scores, padded
    kp = align_up(p.k * 4, UB_BLOCK) // 4
    logits = gm.tensor("logits", p.tokens * p.experts * e)
    weights = gm.tensor("weights", p.tokens * p.k * 4)
    ids = gm.tensor("ids", p.tokens * p.k * 4)
    pair = 8  # (fp32 score, uint32 index)

    def compute(nr, ub_in, ub_out, tmp, consts):
        v, idx, pa, pb, s = tmp
        n = nr * ep
        ops = [cast(n, p.dtype, "fp32", v, ub_in[0])]
        if p.scoring == "softmax":
            ops += [vop("reduce_max", n, "fp32", s, v, out_n=nr)] + scalar_read()
            ops += per_row(nr, ep * 4, lambda at: [vop("adds", ep, "fp32", at(v), at(v))])
            ops += [vop("exp", n, "fp32", v, v), vop("reduce_sum", n, "fp32", s, v, out_n=nr)] + scalar_read()
            ops += per_row(nr, ep * 4, lambda at: [vop("muls", ep, "fp32", at(v), at(v))])
        else:
            ops += sigmoid_ops(n, v, pa, pb, "fp32") + [vop("copy", n, "fp32", v, pa, flops=0)]
        ops += [vop("dup", n, "int32", idx, flops=0),  # CreateVecIndex
                vop("sort32", n, "fp32", pa, v, idx, out_n=2 * n)]
        merge, res = _merge_ops(nr, cdiv(ep, 32), 32, p.k, ep, pa, pb)
        ops += merge
        ops += [vop("gather", nr * kp, "fp32", ub_out[0], res, flops=0),
                vop("gather", nr * kp, "int32", ub_out[1], res, flops=0)]
        if p.norm_topk:
            ops += [vop("reduce_sum", nr * kp, "fp32", s, ub_out[0], out_n=nr)] + scalar_read()
            ops += per_row(nr, kp * 4, lambda at: [vop("muls", kp, "fp32", at(ub_out[0]), at(ub_out[0]))])
        return ops

    pad_in = align_up(p.experts * e, UB_BLOCK)
    k = streaming_kernel(
        "moe_gating", "moe_gating", hw, p.tokens, [Stream(logits, p.experts * e, ub_row_bytes=pad_in)],
        [Stream(weights, p.k * 4, ub_row_bytes=kp * 4), Stream(ids, p.k * 4, ub_row_bytes=kp * 4)], compute,
        tmp_row_bytes=[ep * 4, ep * 4, ep * pair, ep * pair, UB_BLOCK])
    # per score: 4 (softmax: subtract, exp, sum, scale) and a comparison to select it; per kept weight: 2
    return vector_lowered("moe_gating", p, [k], 5 * p.tokens * p.experts + 2 * p.tokens * p.k,
                          [TensorInfo("logits", (p.tokens, p.experts), p.dtype)],
                          [TensorInfo("weights", (p.tokens, p.k), "fp32"),
                           TensorInfo("ids", (p.tokens, p.k), "int32")])


# ================================================================ init routing (permute)


@frozen
class MoeRoutingParams:
    tokens: int = param(8, "tokens routed", validator=_pos)
    hidden: int = param(2048, "elements per token row", validator=_pos)
    k: int = param(8, "experts per token: each token has k rows in expert order", validator=[_pos, _k_validator])
    experts: int = param(128, "experts", validator=_pos)
    dtype: str = param("bf16", "dtype of the rows", validator=dtype_validator())

    @property
    def rows(self) -> int:
        """Rows in expert order: one per (token, expert it is routed to)."""
        return self.tokens * self.k


def permutation(ids: np.ndarray, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(row_map [tokens*k], group_list [experts]) of expert ids [tokens, k]: row_map[t*k + j]
    is the row, in expert order (stable: token order within an expert), of token t's
    j-th expert; group_list[e] how many rows expert e has."""
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= experts):
        bad = flat.max() if flat.max() >= experts else flat.min()
        raise ValueError(f"expert id {bad} out of range [0, {experts})")
    order = np.argsort(flat, kind="stable")  # order[r]: the expanded row (t*k + j) at sorted row r
    row_map = np.empty_like(order)
    row_map[order] = np.arange(order.size)
    return row_map, np.bincount(flat, minlength=experts)


def reference_moe_init_routing(p: MoeRoutingParams, x, specs, ctx) -> dict:
    row_map, groups = permutation(x["ids"].reshape(p.tokens, p.k), p.experts)
    rows = np.empty((p.rows, p.hidden), np.float32)
    rows[row_map] = np.repeat(x["x"].reshape(p.tokens, p.hidden), p.k, axis=0)
    return {"y": rows, "row_map": row_map.astype(np.int32), "group_list": groups.astype(np.int32)}


def _side(src: Pipe, dst: Pipe) -> list:
    """Order one pipe's work before another's outside the tile pipeline."""
    return [SetFlag(src, dst, _SIDE_FLAG), WaitFlag(src, dst, _SIDE_FLAG)]


def _tile_rows(op: str, hw: HwConfig, fixed: int, per_row_bytes: int, most: int) -> int:
    """Rows per tile: as many as fit UB twice over (ping and pong) beside `fixed` bytes."""
    rows = (hw.aiv.ub_bytes - UB_RESERVE - fixed) // (2 * per_row_bytes)
    if rows < 1:
        raise ProgramError(f"op {op}: one row ({per_row_bytes} bytes of UB) twice over does not fit "
                           f"{capacity_text(hw, Mem.UB)}, {fixed} bytes taken by per-core tables")
    return min(rows, most)


@register("moe_init_routing", MoeRoutingParams, reference=reference_moe_init_routing, ins=("x", "ids"),
          outs=("y", "row_map", "group_list"))
def lower_moe_init_routing(p: MoeRoutingParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """MoE token permutation: each token's row copied once per chosen expert, in expert order."""
    # A counting sort (expert ids are small integers), two kernels:
    # 1. count: each core takes a run of the tokens*k ids; per tile V compares them with
    #    every expert (one-hot, ids x E), runs a sum down the one-hot columns (each id's
    #    rank within its expert, on this core) and writes the ranks to row_map; the
    #    core's E counts go to a workspace.
    # 2. scatter: each core reads every core's counts (prefix sums on V: where each
    #    expert's rows start, and group_list), adds its ids' offsets to their ranks
    #    (row_map final) and copies each of its rows x[token] to rows[row_map]: one DMA
    #    in and one out per row, as embedding's gather.
    #    # assumption: every core writes group_list (the same E values; a few hundred bytes)
    # Row addresses are data: row r is read from x[r mod tokens] and written to rows[r]
    # (every row one DMA segment either way; see the module doc).
    e = DTYPE_BYTES[p.dtype]
    row = p.hidden * e
    _check_fits("moe_init_routing", hw, p.tokens * row + p.rows * (row + 8))
    pitch = align_up(row, UB_BLOCK)
    cores = hw.aiv_count
    x = gm.tensor("x", p.tokens * row)
    ids = gm.tensor("ids", p.rows * 4)
    y = gm.tensor("y", p.rows * row)
    row_map = gm.tensor("row_map", p.rows * 4)
    groups = gm.tensor("group_list", p.experts * 4)
    runs = split_runs(p.rows, cores)
    counts = align_up(p.experts * 4, UB_BLOCK)  # a core's E counts, a 32-byte aligned row
    ws = gm.tensor("workspace", len(runs) * counts)

    # kernel 1: count
    buf = Buffers(hw, "moe_init_routing")
    most = runs[0][1] - runs[0][0]
    nr_max = _tile_rows("moe_init_routing", hw, 2 * counts, 2 * 4 + p.experts * 4, most)
    nr_max = max(UB_BLOCK // 4, nr_max // (UB_BLOCK // 4) * (UB_BLOCK // 4))  # one-hot rows 32-byte aligned
    ub_ids = [buf.alloc(f"ids{i}", Mem.UB, nr_max * 4) for i in (0, 1)]
    ub_rank = [buf.alloc(f"rank{i}", Mem.UB, nr_max * 4) for i in (0, 1)]
    ub_hot = buf.alloc("onehot", Mem.UB, p.experts * nr_max * 4)
    ub_count = buf.alloc("counts", Mem.UB, counts)

    def count_tile(r0: int, nr: int):
        def make(k: int):
            # per expert e: the ids equal to e (a one-hot row), and their running count
            # (# assumption: the prefix sum giving each id its rank costs what the row's sum does)
            hot = addr(ub_hot, e=nr_max * 4)
            work = [Loop("e", p.experts, [vop("compare", nr, "int32", hot, ub_ids[k], flops=0),
                                          vop("reduce_sum", nr, "int32", hot, hot, out_n=1)]),
                    vop("add", p.experts, "int32", ub_count, ub_count, ub_count),
                    vop("gather", nr, "int32", ub_rank[k], ub_hot, flops=0)]
            return ([Copy(Mem.GM, Mem.UB, ids.addr + r0 * 4, ub_ids[k], nr * 4)], work,
                    [Copy(Mem.UB, Mem.GM, ub_rank[k], row_map.addr + r0 * 4, nr * 4)])
        return make

    bodies = []
    for c, (lo, hi) in enumerate(runs):
        tiles = [count_tile(r, min(nr_max, hi - r)) for r in range(lo, hi, nr_max)]
        body = [vop("dup", p.experts, "int32", ub_count, flops=0)] + pipeline_prologue()
        body += tile_pipeline(tiles) + pipeline_epilogue()
        body += _side(Pipe.V, Pipe.MTE3) + [Copy(Mem.UB, Mem.GM, ub_count, ws.addr + c * counts, counts)]
        bodies.append(body)
    k1 = tile_kernel("moe_init_routing_count", "moe_init_routing", buf.buffers, bodies, [ids, row_map, ws])

    # kernel 2: offsets and scatter
    buf = Buffers(hw, "moe_init_routing")
    table = len(runs) * counts
    # per row: its x row, its row_map entry and its expert's offset (gathered from the E offsets)
    nr_max = _tile_rows("moe_init_routing", hw, table + counts, pitch + 4 + 4, most)
    ub_table = buf.alloc("counts", Mem.UB, table)
    ub_off = buf.alloc("offsets", Mem.UB, max(counts, align_up(nr_max * 4, UB_BLOCK)))
    ub_rows = [buf.alloc(f"rows{i}", Mem.UB, nr_max * pitch) for i in (0, 1)]
    ub_map = [buf.alloc(f"map{i}", Mem.UB, nr_max * 4) for i in (0, 1)]

    def scatter_tile(r0: int, nr: int):
        def make(k: int):
            loads = [Copy(Mem.GM, Mem.UB, row_map.addr + r0 * 4, ub_map[k], nr * 4)]
            loads += compress([[Copy(Mem.GM, Mem.UB, x.addr + (r0 + i) % p.tokens * row, ub_rows[k] + i * pitch,
                                     row)] for i in range(nr)], "r")
            work = [vop("gather", nr, "int32", ub_map[k], ub_off, flops=0),  # each id's expert offset
                    vop("add", nr, "int32", ub_map[k], ub_map[k], ub_map[k])]
            stores = [Copy(Mem.UB, Mem.GM, ub_map[k], row_map.addr + r0 * 4, nr * 4)]
            stores += compress([[Copy(Mem.UB, Mem.GM, ub_rows[k] + i * pitch, y.addr + (r0 + i) * row, row)]
                                for i in range(nr)], "r")
            return loads, work, stores
        return make

    head = [Copy(Mem.GM, Mem.UB, ws.addr, ub_table, table)] + _side(Pipe.MTE2, Pipe.V)
    head += [vop("dup", p.experts, "int32", ub_off, flops=0),  # each expert's rows: a sum over the cores
             Loop("c", len(runs), [vop("add", p.experts, "int32", ub_off, addr(ub_table, c=counts), ub_off)])]
    # (# assumption: the scan over experts giving where each expert's rows start is one more pass, not modelled)
    head += _side(Pipe.V, Pipe.MTE3) + [Copy(Mem.UB, Mem.GM, ub_off, groups.addr, p.experts * 4)]
    bodies = []
    for lo, hi in runs:
        tiles = [scatter_tile(r, min(nr_max, hi - r)) for r in range(lo, hi, nr_max)]
        bodies.append(head + pipeline_prologue() + tile_pipeline(tiles) + pipeline_epilogue())
    k2 = tile_kernel("moe_init_routing_scatter", "moe_init_routing", buf.buffers, bodies,
                     [ws, x, row_map, y, groups])
    ins = [TensorInfo("x", (p.tokens, p.hidden), p.dtype), TensorInfo("ids", (p.tokens, p.k), "int32")]
    outs = [TensorInfo("y", (p.rows, p.hidden), p.dtype), TensorInfo("row_map", (p.rows,), "int32"),
            TensorInfo("group_list", (p.experts,), "int32")]
    lowered = vector_lowered("moe_init_routing", p, [k1, k2], 2 * p.rows * p.experts, ins, outs,
                             workspace_bytes=table)
    # x is read once per expert a token goes to (the roofline's bytes: every row moved)
    return _with_min_bytes(lowered, p.rows * row * 2 + p.rows * 4 * 3 + p.experts * 4)


def _check_fits(op: str, hw: HwConfig, nbytes: int) -> None:
    """Refuse, before building a program per row, tensors that could not be in device memory."""
    if nbytes > hw.hbm.hbm_bytes:
        raise ConfigError(f"op {op}: its tensors take {nbytes} bytes of GM, more than hbm.hbm_bytes "
                          f"{hw.hbm.hbm_bytes}")


def _with_min_bytes(low: Lowered, nbytes: int) -> Lowered:
    return attrs.evolve(low, min_gm_bytes=float(nbytes))


# ================================================================ finalize routing (combine)


@frozen
class MoeFinalizeParams:
    tokens: int = param(8, "tokens", validator=_pos)
    hidden: int = param(2048, "elements per token row", validator=_pos)
    k: int = param(8, "expert rows combined per token", validator=_pos)
    dtype: str = param("bf16", "dtype of the rows and the output", validator=dtype_validator())
    residual: bool = param(False, "add a residual [tokens, hidden] (the layer's input)")
    shared: bool = param(False, "add the shared experts' output [tokens, hidden]")

    @property
    def rows(self) -> int:
        return self.tokens * self.k


def reference_moe_finalize_routing(p: MoeFinalizeParams, x, specs, ctx) -> dict:
    rows = x["x"].reshape(p.rows, p.hidden)
    row_map = x["row_map"].reshape(p.tokens, p.k).astype(np.int64)
    if row_map.min() < 0 or row_map.max() >= p.rows:
        raise ValueError(f"row_map holds row {row_map.max()}, expected rows 0 .. {p.rows - 1}")
    w = x["weights"].reshape(p.tokens, p.k, 1)
    y = np.sum(rows[row_map] * w, axis=1)
    for name in ("residual", "shared"):
        if getattr(p, name):
            y = y + x[name].reshape(p.tokens, p.hidden)
    return {"y": y}


@register("moe_finalize_routing", MoeFinalizeParams, reference=reference_moe_finalize_routing,
          ins=("x", "row_map", "weights", "residual", "shared"), outs=("y",))
def lower_moe_finalize_routing(p: MoeFinalizeParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """MoE combine: each token's expert rows gathered back, weighted by the router and summed (+ residual, shared)."""
    # Each core takes a run of tokens. Its head loads the run's row_map and weights
    # (the scalar unit reads them: row addresses and weight scalars). Per tile of
    # tokens: MTE2 gathers the k expert rows of each token (one DMA per row) and loads
    # the residual and shared rows; V casts to fp32, multiplies each expert row by its
    # weight and sums (Muls, Add per row), adds the residual and shared rows and casts
    # back; MTE3 stores the tile. Row addresses are data: token t's rows are read from
    # rows[t*k .. t*k + k - 1] (one DMA segment each, wherever they are).
    e = DTYPE_BYTES[p.dtype]
    row = p.hidden * e
    _check_fits("moe_finalize_routing", hw, p.rows * (row + 8) + 3 * p.tokens * row)
    pitch = align_up(row, UB_BLOCK)
    f32 = align_up(p.hidden * 4, UB_BLOCK)
    extra = [name for name in ("residual", "shared") if getattr(p, name)]
    rows = gm.tensor("x", p.rows * row)
    row_map = gm.tensor("row_map", p.rows * 4)
    weights = gm.tensor("weights", p.rows * 4)
    adds = [gm.tensor(name, p.tokens * row) for name in extra]
    y = gm.tensor("y", p.tokens * row)
    runs = split_runs(p.tokens, hw.aiv_count)
    most = runs[0][1] - runs[0][0]
    table = 2 * align_up(most * p.k * 4, UB_BLOCK)
    per_token = (p.k + len(extra) + 1) * pitch  # expert rows, residual / shared rows, the output row
    buf = Buffers(hw, "moe_finalize_routing")
    nr_max = _tile_rows("moe_finalize_routing", hw, table + 2 * f32, per_token, most)
    ub_map = buf.alloc("row_map", Mem.UB, most * p.k * 4)
    ub_w = buf.alloc("weights", Mem.UB, most * p.k * 4)
    ub_in = [buf.alloc(f"in{i}", Mem.UB, nr_max * (p.k + len(extra)) * pitch) for i in (0, 1)]
    ub_out = [buf.alloc(f"out{i}", Mem.UB, nr_max * pitch) for i in (0, 1)]
    acc, tmp = buf.alloc("acc", Mem.UB, f32), buf.alloc("tmp", Mem.UB, f32)

    def tile(t0: int, nr: int):
        def make(k: int):
            loads = compress([[Copy(Mem.GM, Mem.UB, rows.addr + ((t0 + t) * p.k + j) * row,
                                    ub_in[k] + (t * p.k + j) * pitch, row)]
                              for t in range(nr) for j in range(p.k)], "r")
            loads += [Copy(Mem.GM, Mem.UB, a.addr + t0 * row, ub_in[k] + (nr * p.k + i * nr) * pitch, nr * row)
                      for i, a in enumerate(adds)]  # # assumption: row == pitch (hidden a multiple of 16)
            sources = p.k + len(extra)

            # per token r of the tile: its expert rows step k rows, its residual / shared row and output one
            token = [vop("dup", p.hidden, "fp32", acc, flops=0)]
            for j in range(sources):
                src = (addr(ub_in[k] + j * pitch, r=p.k * pitch) if j < p.k
                       else addr(ub_in[k] + (nr * p.k + (j - p.k) * nr) * pitch, r=pitch))
                token += [cast(p.hidden, p.dtype, "fp32", tmp, src)]
                if j < p.k:  # weighted by the router
                    token += [vop("muls", p.hidden, "fp32", tmp, tmp)]
                token += [vop("add", p.hidden, "fp32", acc, acc, tmp)]
            token += [cast(p.hidden, "fp32", p.dtype, addr(ub_out[k], r=pitch), acc)]
            work = [Loop("r", nr, token)]
            return loads, work, [Copy(Mem.UB, Mem.GM, ub_out[k], y.addr + t0 * row, nr * row)]
        return make

    bodies = []
    for lo, hi in runs:
        head = [Copy(Mem.GM, Mem.UB, row_map.addr + lo * p.k * 4, ub_map, (hi - lo) * p.k * 4),
                Copy(Mem.GM, Mem.UB, weights.addr + lo * p.k * 4, ub_w, (hi - lo) * p.k * 4)]
        head += _side(Pipe.MTE2, Pipe.S) + _side(Pipe.S, Pipe.MTE2)
        tiles = [tile(t, min(nr_max, hi - t)) for t in range(lo, hi, nr_max)]
        bodies.append(head + pipeline_prologue() + tile_pipeline(tiles) + pipeline_epilogue())
    kernel = tile_kernel("moe_finalize_routing", "moe_finalize_routing", buf.buffers, bodies,
                         [row_map, weights, rows, *adds, y])
    ins = [TensorInfo("x", (p.rows, p.hidden), p.dtype), TensorInfo("row_map", (p.rows,), "int32"),
           TensorInfo("weights", (p.tokens, p.k), "fp32"),
           *(TensorInfo(name, (p.tokens, p.hidden), p.dtype) for name in extra)]
    # per element of each expert row: a multiply and an add; one add per residual / shared element
    return vector_lowered("moe_finalize_routing", p, [kernel], p.tokens * p.hidden * (2 * p.k + len(extra)),
                          ins, [TensorInfo("y", (p.tokens, p.hidden), p.dtype)])


# ================================================================ dense reference


def dense_moe(norm: np.ndarray, router: np.ndarray, experts: tuple[np.ndarray, np.ndarray, np.ndarray],
              gating_params: MoeGatingParams, shared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
              ) -> np.ndarray:
    """A MoE FFN computed densely, with no permutation: every expert on every token,
    weighted by a dense [tokens, experts] gate matrix (the router's k weights per
    token, zeros elsewhere), plus the shared experts. `norm` [tokens, hidden] is the
    FFN's input, `router` [experts, hidden], `experts` the gate, up [experts, f, hidden]
    and down [experts, hidden, f] weights, `shared` gate, up [fs, hidden], down
    [hidden, fs]. What validate holds the permuted, grouped path to."""
    from npusim.ops.reference import silu

    weights, ids = gating(gating_params, norm @ router.T)
    gate = np.zeros((norm.shape[0], gating_params.experts), np.float32)
    np.put_along_axis(gate, ids, weights, axis=-1)
    wg, wu, wd = experts
    out = np.zeros_like(norm)
    for e in range(gating_params.experts):
        out += gate[:, e:e + 1] * ((silu(norm @ wg[e].T) * (norm @ wu[e].T)) @ wd[e].T)
    if shared is not None:
        sg, su, sd = shared
        out += (silu(norm @ sg.T) * (norm @ su.T)) @ sd.T
    return out
