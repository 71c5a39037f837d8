"""The decoder layer's blocks: attention, and the FFN the workload names (`mlp`).

build_decoder (npusim.graph.build) walks the layers; each layer is an attention
block then an FFN block, each a function that appends its nodes to a GraphBuilder and
returns the tensor it leaves in the residual stream:

    attention_block:  rms_norm -> q, k, v matmuls -> [q, k norms] -> rope -> per part
                      attention (build._attention) -> o matmul -> add (residual)
    FFN_BUILDERS["swiglu"]: rms_norm -> gate, up matmuls -> silu -> mul -> down matmul -> add
    FFN_BUILDERS["moe"]:    rms_norm -> router matmul -> moe_gating -> moe_init_routing ->
                      [shared experts: gate, up, silu, mul, down] -> [all_to_all dispatch]
                      -> grouped gate, up -> silu -> mul -> grouped down -> [all_to_all
                      combine] -> moe_finalize_routing (+ residual; under tensor
                      parallelism: the partial rows all-reduced, then + residual)

A MoE decoder's first `first_dense_layers` layers take the SwiGLU block
(`ffn_block`). The MoE ops are npusim.ops.moe and npusim.ops.grouped_matmul; each
MoE layer's expert row counts (the grouped matmuls' group sizes) are the routing
draw of npusim.graph.routing. Under expert parallelism (`ep` devices, each with its
own tokens and experts / ep experts) the graph is the busiest device's: in each
layer, the one whose experts receive the most rows, since both all-to-alls wait for
it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from npusim.graph.ir import Node, TensorSpec
from npusim.graph.routing import card_routing, draw_routing
from npusim.workload import Workload


class GraphBuilder:
    """Tensors and nodes of a graph being built, in declaration order."""

    def __init__(self, w: Workload):
        self.w = w
        self.tensors: dict[str, TensorSpec] = {}
        self.nodes: list[Node] = []

    def tensor(self, name: str, shape: Sequence[int], kind: str = "activation", dtype: str | None = None,
               format: str = "ND") -> str:
        if name in self.tensors:
            raise ValueError(f"tensor '{name}' declared twice")
        self.tensors[name] = TensorSpec(name, tuple(shape), dtype or self.w.dtype, format, kind)
        return name

    def weight(self, name: str, shape: Sequence[int], dtype: str | None = None, format: str = "ND") -> str:
        return self.tensors[name].name if name in self.tensors else self.tensor(name, shape, "weight", dtype, format)

    def node(self, name: str, op_type: str, params: dict[str, Any], inputs: dict[str, str],
             outputs: dict[str, str], layer: int | None = None) -> None:
        self.nodes.append(Node(name, op_type, params, inputs, outputs, layer))

    def matmul(self, name: str, a: str, w: str, out: str, m: int, n: int, k: int, layer: int | None,
               bias: str | None = None) -> None:
        """out [m, n] = a [m, k] @ w[n, k]^T (+ bias). The weight is stored NZ (converted
        offline, the cube's operand layout; a tied embedding stays ND); the naive framework converts the ND
        activation to NZ with its own TransData before every matmul (what the layout
        pass removes)."""
        dt = self.w.dtype
        a_nz = self.tensor(f"{name}.a_nz", (m, k), format="NZ")
        self.node(f"{name}.to_nz", "trans_data", dict(shape=(m, k), dtype=dt, src_format="ND", dst_format="NZ"),
                  {"x": a}, {"y": a_nz}, layer)
        params = dict(m=m, n=n, k=k, dtype=dt, out_dtype=dt, trans_b=True, bias=bias is not None,
                      format_a="NZ", format_b=self.tensors[w].format)
        ins = {"a": a_nz, "b": w} | ({"bias": bias} if bias else {})
        self.node(name, "matmul", params, ins, {"c": out}, layer)


class Layer:
    """Decoder layer `i` of one device's graph: names start with "L{i}.", `n` token-major
    rows, its weights' shapes (a tensor-parallel shard's under `tp`, experts / ep of the
    experts under `ep`)."""

    def __init__(self, b: GraphBuilder, i: int, n: int, tp: int, shapes: dict[str, tuple[int, ...]], ep: int = 1):
        self.b, self.w, self.i, self.n, self.tp, self.shapes, self.ep = b, b.w, i, n, tp, shapes, ep
        self.L = f"L{i}."

    def act(self, name: str, shape: Sequence[int], format: str = "ND", dtype: str | None = None) -> str:
        return self.b.tensor(self.L + name, shape, format=format, dtype=dtype)

    def wt(self, name: str) -> str:
        if name in ("bq", "bk", "bv"):  # fp32 bias rows
            return self.b.weight(self.L + name, self.shapes[name], "fp32")
        # Linear weights NZ (the cube's layout); an expert weight [experts, out, in] ND, as GroupedMatmul reads it
        nz = name.startswith("w") and not name.endswith("_experts")
        return self.b.weight(self.L + name, self.shapes[name], format="NZ" if nz else "ND")

    def node(self, name: str, op_type: str, params: dict[str, Any], inputs: dict[str, str],
             outputs: dict[str, str]) -> None:
        self.b.node(self.L + name, op_type, params, inputs, outputs, self.i)

    def all_reduce(self, name: str, partial: str) -> str:
        """Sum a row-split GEMM's partial output over the tensor-parallel group."""
        if self.tp == 1:
            return partial
        out = self.act(name + "_sum", self.b.tensors[partial].shape)
        self.node(name + "_all_reduce", "all_reduce", dict(elements=self.n * self.w.hidden_size, dtype=self.w.dtype,
                                                           devices=self.tp), {"x": partial}, {"y": out})
        return out


def attention_block(s: Layer, x: str, rows: tuple[int, int], parts: list, cos: str, sin: str, batch: int,
                    ctx: int, sp: int, phase: str, attention: Callable) -> str:
    """RMSNorm, Q/K/V projections, [per-head Q and K norms], RoPE, [an all_gather of K
    and V over a sequence-parallel group], each attention part (`attention`:
    build._attention), the O projection [all-reduced] and the residual add."""
    b, w, i, n, L = s.b, s.w, s.i, s.n, s.L
    h, d, nh, kvh, dt = w.hidden_size, w.head_dim, w.heads // s.tp, w.kv_heads // s.tp, w.dtype
    norm = s.act("attn_norm_out", (n, h))
    s.node("attn_norm", "rms_norm", dict(shape=(n, h), dtype=dt, eps=w.norm_eps),
           {"x": x, "gamma": s.wt("attn_norm")}, {"y": norm})
    q, k, val = s.act("q", (n, nh * d)), s.act("k", (n, kvh * d)), s.act("v", (*rows, kvh, d))
    for proj, out, size in (("q", q, nh * d), ("k", k, kvh * d), ("v", val, kvh * d)):
        b.matmul(L + f"{proj}_proj", norm, s.wt(f"w{proj}"), out, n, size, h, i,
                 bias=s.wt(f"b{proj}") if w.qkv_bias else None)
    if w.qk_norm:  # Qwen3: an RMSNorm over each head of Q and K (gamma [head_dim]) before RoPE
        for name, heads in (("q", nh), ("k", kvh)):
            normed = s.act(f"{name}_normed", (n, heads * d))
            s.node(f"{name}_norm", "rms_norm", dict(shape=(n * heads, d), dtype=dt, eps=w.norm_eps),
                   {"x": q if name == "q" else k, "gamma": s.wt(f"{name}_norm")}, {"y": normed})
            q, k = (normed, k) if name == "q" else (q, normed)
    q_rot = s.act("q_rot", (*rows, nh, d), "BSND")
    k_rot = s.act("k_rot", (*rows, kvh, d))
    for name, src, dst, heads in (("rope_q", q, q_rot, nh), ("rope_k", k, k_rot, kvh)):
        s.node(name, "rope", dict(shape=(n, heads, d), dtype=dt), {"x": src, "cos": cos, "sin": sin}, {"y": dst})
    written = None  # tokens each part writes into its cache (default its new tokens)
    if sp > 1:  # every device's K and V of the prompt, in token order
        # assumption: the gathered K/V land in the order kv_cache_write reads (no reorder kernel)
        for name in ("k_rot", "v"):
            whole = s.act(name + "_all", (batch, ctx, kvh, d))
            s.node(name + "_all_gather", "all_gather", dict(elements=batch * ctx * kvh * d, dtype=dt, devices=sp,
                                                            axis=1),
                   {"x": k_rot if name == "k_rot" else val}, {"y": whole})
            k_rot, val = (whole, val) if name == "k_rot" else (k_rot, whole)
        written = ctx
    attn = L + "attn"  # declared by the first part (after its caches and scores)
    for p, pb, ps, masked in parts:
        attention(b, L + p, i, q_rot, k_rot, val, (attn, (*rows, nh, d)), pb, ps, ctx, masked,
                  f"{p}attn_mask", position=-1 if phase != "prefill" else 0, tp=s.tp, written=written)
    o = s.act("o", (n, h))
    b.matmul(L + "o_proj", attn, s.wt("wo"), o, n, h, nh * d, i)
    o = s.all_reduce("o", o)
    x_attn = s.act("x_attn", (n, h))
    s.node("attn_residual", "add", dict(shape=(n, h), dtype=dt), {"x1": x, "x2": o}, {"y": x_attn})
    return x_attn


def _ffn_norm(s: Layer, x: str, rows: int | None = None) -> str:
    """The FFN's RMSNorm over the first `rows` rows of x (default all of them)."""
    rows = s.n if rows is None else rows
    norm = s.act("ffn_norm_out", (rows, s.w.hidden_size))
    s.node("ffn_norm", "rms_norm", dict(shape=(rows, s.w.hidden_size), dtype=s.w.dtype, eps=s.w.norm_eps),
           {"x": x, "gamma": s.wt("ffn_norm")}, {"y": norm})
    return norm


def _swiglu(s: Layer, x: str, rows: int, f: str, names: tuple[str, str, str], prefix: str = "") -> str:
    """down(silu(gate(x)) * up(x)) over `rows` rows with Linear weights `names` (gate,
    up, down) of width `f`: the dense FFN's matmuls and vector ops. Returns down's output."""
    b, h, dt, L, i = s.b, s.w.hidden_size, s.w.dtype, s.L, s.i
    gate, up = s.act(prefix + "gate", (rows, f)), s.act(prefix + "up", (rows, f))
    b.matmul(L + prefix + "gate_proj", x, s.wt(names[0]), gate, rows, f, h, i)
    b.matmul(L + prefix + "up_proj", x, s.wt(names[1]), up, rows, f, h, i)
    gate_act = s.act(prefix + "gate_act", (rows, f))
    s.node(prefix + "silu", "silu", dict(shape=(rows, f), dtype=dt), {"x": gate}, {"y": gate_act})
    ffn = s.act(prefix + "ffn_act", (rows, f))
    s.node(prefix + "mul", "mul", dict(shape=(rows, f), dtype=dt), {"x1": gate_act, "x2": up}, {"y": ffn})
    down = s.act(prefix + "down", (rows, h))
    b.matmul(L + prefix + "down_proj", ffn, s.wt(names[2]), down, rows, h, f, i)
    return down


def swiglu_ffn(s: Layer, x: str) -> str:
    """RMSNorm, the SwiGLU FFN [down all-reduced], the residual add."""
    n, h = s.n, s.w.hidden_size
    down = _swiglu(s, _ffn_norm(s, x), n, s.w.ffn_size // s.tp, ("w_gate", "w_up", "w_down"))
    down = s.all_reduce("down", down)
    out = s.act("out", (n, h))
    s.node("ffn_residual", "add", dict(shape=(n, h), dtype=s.w.dtype), {"x1": x, "x2": down}, {"y": out})
    return out


def moe_ffn(s: Layer, x: str) -> str:
    """RMSNorm, the router, the tokens permuted into expert order, the experts' SwiGLU
    as grouped matmuls over their rows, [the shared experts' SwiGLU over every token],
    and the combine (weighted by the router, plus the shared output and the residual).

    Under tensor parallelism alone each device holds 1/tp of every expert's FFN columns
    and the combine's partial rows are all-reduced before the residual is added. Under
    expert parallelism with tensor-parallel attention each device of a group takes its
    share of the group's tokens (rows [r n/tp, (r+1) n/tp) of the all-reduced attention
    output) through the whole MoE layer, and the group all_gathers the results.
    # assumption: the shares are ceil(n / tp) tokens; the simulated device's rows are the
    # first share (its reads start at row 0 of the layer input), the gathered output padded."""
    w, L, i = s.w, s.L, s.i
    h, dt, e, k, fe = w.hidden_size, w.dtype, w.experts, w.experts_per_token, w.expert_ffn_size
    split = s.tp if s.ep == 1 else 1  # the experts' FFN columns are split over tensor parallelism alone
    n = s.n if s.ep == 1 else -(-s.n // s.tp)  # tokens this device takes through the layer
    norm = _ffn_norm(s, x, n)
    logits = s.act("router_logits", (n, e))
    s.b.matmul(L + "router", norm, s.wt("w_router"), logits, n, e, h, i)
    weights, ids = s.act("router_weights", (n, k), dtype="fp32"), s.act("router_ids", (n, k), dtype="int32")
    s.node("moe_gating", "moe_gating", dict(tokens=n, experts=e, k=k, dtype=dt, scoring=w.router_scoring,
                                            norm_topk=w.router_norm_topk), {"logits": logits},
           {"weights": weights, "ids": ids})
    rows = n * k
    if s.ep == 1:
        groups = draw_routing(w, i, n).tokens_per_expert  # the timing run's rows per expert (after any cap)
        buf, received = rows, sum(groups)
    else:  # this device is, in every layer, the one whose experts receive the most rows
        cards = card_routing(w, i, n, s.ep)
        groups = cards.groups(cards.busiest_card)
        received = cards.rows_per_card[cards.busiest_card]
        # assumption: the all_to_all is symmetric - every device sends and receives as many
        # bytes as the busiest one receives (or sends, n x k rows, if more): the exchange
        # waits for its slowest member
        buf = max(rows, received)
    permuted = s.act("moe_rows", (buf, h))
    row_map, group_list = s.act("moe_row_map", (rows,), dtype="int32"), s.act("moe_group_list", (e,), dtype="int32")
    s.node("moe_init_routing", "moe_init_routing", dict(tokens=n, hidden=h, k=k, experts=e, dtype=dt),
           {"x": norm, "ids": ids}, {"y": permuted, "row_map": row_map, "group_list": group_list})
    shared = {}
    if w.shared_experts:  # every token through the shared experts, as one SwiGLU of their summed width;
        # built before the routed experts (as frameworks issue it): they read only the norm, so the
        # streams pass runs them beside the dispatch all-to-all and the routed experts' GEMMs
        shared["shared"] = _swiglu(s, norm, n, w.shared_experts * fe // split,
                                   ("w_gate_shared", "w_up_shared", "w_down_shared"), "shared_")

    def all_to_all(name: str, x: str) -> str:
        """Rows to (dispatch) or back from (combine) the devices holding their experts."""
        out = s.act(name, (buf, h))
        s.node(name + "_all_to_all", "all_to_all", dict(elements=buf * h, dtype=dt, devices=s.ep), {"x": x},
               {"y": out})
        return out

    if s.ep > 1:
        permuted = all_to_all("moe_dispatched", permuted)
    # the numpy reference splits rows by the router's group_list (one device's experts: not modelled with ep)
    counts = {"group_list": group_list} if s.ep == 1 else {}

    def grouped(name: str, a: str, weight: str, out: str, n_out: int, k_in: int) -> None:
        s.node(name, "grouped_matmul", dict(group_sizes=groups, k=k_in, n=n_out, dtype=dt, trans_b=True),
               {"x": a, "weight": s.wt(weight)} | counts, {"y": out})

    rows = received  # the expert GEMMs run over the rows this device's experts received
    fe //= split
    gate, up = s.act("experts_gate", (rows, fe)), s.act("experts_up", (rows, fe))
    grouped("experts_gate_proj", permuted, "w_gate_experts", gate, fe, h)
    grouped("experts_up_proj", permuted, "w_up_experts", up, fe, h)
    gate_act = s.act("experts_gate_act", (rows, fe))
    s.node("experts_silu", "silu", dict(shape=(rows, fe), dtype=dt), {"x": gate}, {"y": gate_act})
    act = s.act("experts_act", (rows, fe))
    s.node("experts_mul", "mul", dict(shape=(rows, fe), dtype=dt), {"x1": gate_act, "x2": up}, {"y": act})
    down = s.act("experts_down", (buf, h))
    grouped("experts_down_proj", act, "w_down_experts", down, h, fe)
    if s.ep > 1:
        down = all_to_all("moe_combined", down)
    combine = {"x": down, "row_map": row_map, "weights": weights} | shared
    if split == 1:
        out = s.act("out" if s.tp == 1 else "out_share", (n, h))
        s.node("moe_finalize_routing", "moe_finalize_routing",
               dict(tokens=n, hidden=h, k=k, dtype=dt, residual=True, shared=bool(shared)),
               combine | {"residual": x}, {"y": out})
        if s.tp == 1:
            return out
        gathered = s.act("out", (n * s.tp, h))  # the group's shares, stacked (padded to tp equal shares)
        s.node("moe_all_gather", "all_gather", dict(elements=n * s.tp * h, dtype=dt, devices=s.tp),
               {"x": out}, {"y": gathered})
        return gathered
    # each device's experts gave partial rows (its FFN columns): combine them, sum over the
    # group, then add the residual once
    partial = s.act("moe_partial", (n, h))
    s.node("moe_finalize_routing", "moe_finalize_routing",
           dict(tokens=n, hidden=h, k=k, dtype=dt, residual=False, shared=bool(shared)), combine, {"y": partial})
    out = s.act("out", (n, h))
    s.node("ffn_residual", "add", dict(shape=(n, h), dtype=dt), {"x1": x, "x2": s.all_reduce("moe", partial)},
           {"y": out})
    return out


FFN_BUILDERS: dict[str, Callable[[Layer, str], str]] = {"swiglu": swiglu_ffn, "moe": moe_ffn}


def ffn_block(w: Workload, layer: int) -> Callable[[Layer, str], str]:
    """The FFN builder of layer `layer`: the workload's `mlp`, SwiGLU in its first dense layers."""
    return FFN_BUILDERS[w.mlp if w.is_moe_layer(layer) or not w.is_moe else "swiglu"]


__all__ = ["FFN_BUILDERS", "GraphBuilder", "Layer", "attention_block", "ffn_block", "moe_ffn", "swiglu_ffn"]
