"""The MoE breakdown of a simulated step: where a mixture-of-experts decoder's FFN
time goes (router, permute, experts, shared experts, combine, all-to-all) and how
the step's tokens were routed (rows per expert, experts used, the busiest expert's
share), for the run summary and the JSON."""

from __future__ import annotations

from npusim.graph.ir import Graph, Node
from npusim.graph.routing import card_routing, expert_capacity
from npusim.runtime.run import GraphRun

# A MoE layer's FFN parts, in the order the layer runs them.
PARTS = ("router", "permute", "experts", "shared_experts", "combine", "all_to_all")
# Names (after "L{i}.") of the dense SwiGLU nodes a MoE layer holds: its shared experts'
# (the builder prefixes them "shared_"; the fusion pass renames fused ones gate_up_proj, swiglu)
_SHARED_NAMES = ("gate_up_proj", "swiglu")


def moe_part(node: Node, graph: Graph) -> str | None:
    """The MoE part a node's kernels count towards (None: not part of a MoE layer's FFN)."""
    w = graph.workload
    if node.layer is None or not getattr(w, "is_moe", False) or not w.is_moe_layer(node.layer):
        return None
    local = node.name[len(f"L{node.layer}."):]
    if node.op_type == "moe_gating" or local.split(".")[0] == "router":
        return "router"
    if node.op_type == "moe_init_routing":
        return "permute"
    if node.op_type == "grouped_matmul" or local.startswith("experts_"):
        return "experts"
    if node.op_type == "moe_finalize_routing":
        return "combine"
    if node.op_type == "all_to_all":
        return "all_to_all"
    if local.startswith("shared_") or local.split(".")[0] in _SHARED_NAMES:
        return "shared_experts"
    return None


def routing_rows(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Layer -> rows per expert of its MoE FFN (the routing draw the grouped matmuls ran
    with: under expert parallelism, the simulated device's experts')."""
    out = {}
    for n in graph.nodes:
        if n.op_type == "grouped_matmul" and n.layer is not None and n.layer not in out:
            out[n.layer] = tuple(n.args.group_sizes)
    return out


def moe_breakdown(run: GraphRun) -> dict | None:
    """The step's MoE figures (None for a dense decoder): per part its kernel time (µs)
    and share of the step's kernel time; the routing (the draw, rows per expert per
    layer, experts used per layer, the busiest expert's share per layer); under a
    capacity cap (capacity_factor > 0) the rows kept, routed and dropped (_dropped)."""
    w = run.graph.workload
    if not getattr(w, "is_moe", False):
        return None
    us = dict.fromkeys(PARTS, 0.0)
    total = 0.0
    for rec in run.result.kernels:
        t = run.hw.us(rec.cycles)
        total += t
        node = run.node(rec)
        part = moe_part(node, run.graph) if node is not None else None
        if part:
            us[part] += t
    rows = routing_rows(run.graph)
    layers = sorted(rows)
    ep = getattr(run.graph, "ep", 1)
    cards = {}
    if ep > 1 or w.capacity_factor:  # the draw the graph was built with: every device's rows, the dropped rows
        tokens = next(n.args.tokens for n in run.graph.nodes if n.op_type == "moe_gating")
        cards = {i: card_routing(w, i, tokens, ep) for i in layers}
    return {
        "routing": w.routing + (f" (exponent {w.routing_zipf_exponent})" if w.routing == "zipf" else "")
        + (f" ({w.routing_trace})" if w.routing == "trace" else ""),
        "experts": w.experts, "experts_per_token": w.experts_per_token,
        "us": us, "share_of_kernel_time": {k: (v / total if total else 0.0) for k, v in us.items()},
        "layers": layers,
        "tokens_per_expert": [list(rows[i]) for i in layers],
        "experts_used": [sum(1 for c in rows[i] if c) for i in layers],
        "busiest_expert_share": [max(rows[i]) / sum(rows[i]) for i in layers],
    } | ({"ep": ep, "rows_per_card": [list(cards[i].rows_per_card) for i in layers],
          "busiest_card_share": [max(cards[i].rows_per_card) / sum(cards[i].rows_per_card) for i in layers]}
         if ep > 1 else {}) | (
        _dropped(w, tokens * ep, [cards[i].routing for i in layers]) if w.capacity_factor else {})


def _dropped(w, tokens: int, routings: list) -> dict:
    """The capacity cap's figures: the factor, an expert's capacity in rows, and per MoE
    layer the routed rows (token, expert pairs of the expert-parallel group), the
    dropped ones and their share."""
    routed = [sum(r.routed_per_expert) for r in routings]
    dropped = [r.dropped_rows for r in routings]
    return {"capacity_factor": w.capacity_factor, "expert_capacity_rows": expert_capacity(w, tokens),
            "routed_rows": routed, "dropped_rows": dropped,
            "dropped_share": [d / r for d, r in zip(dropped, routed)]}


def moe_lines(b: dict) -> list[str]:
    """The summary's MoE lines."""
    kernel_share = b["share_of_kernel_time"]
    parts = ", ".join(f"{k.replace('_', ' ')} {b['us'][k]:,.1f} us ({100 * kernel_share[k]:.1f}%)"
                      for k in PARTS if b["us"][k] or k not in ("shared_experts", "all_to_all"))
    used, share = b["experts_used"], b["busiest_expert_share"]
    rows = [sum(r) for r in b["tokens_per_expert"]]
    worst = max(range(len(share)), key=share.__getitem__) if share else None
    lines = [f"  MoE            {parts} (% of the kernel time)"]
    if worst is not None and "ep" in b:
        cards, card_share = b["rows_per_card"], b["busiest_card_share"]
        lines.append(
            f"  routing        {b['routing']}, experts over {b['ep']} devices ({b['experts'] // b['ep']} each): "
            f"the busiest device's experts receive {sum(rows) / len(rows):.1f} rows per MoE layer on average "
            f"({100 * sum(card_share) / len(card_share):.1f}% of the group's rows, {100 * max(card_share):.1f}% at "
            f"most; even would be {100 / b['ep']:.1f}%), over {sum(used) / len(used):.1f} of its experts; it is the "
            f"device simulated")
    elif worst is not None:
        lines.append(
            f"  routing        {b['routing']}: {_rows_clause(b, rows)} over "
            f"{sum(used) / len(used):.1f} of {b['experts']} experts on average (fewest {min(used)}, most {max(used)}); "
            f"busiest expert {100 * sum(share) / len(share):.1f}% of a layer's rows on average, "
            f"{100 * share[worst]:.1f}% at most (L{b['layers'][worst]}, even would be {100 / b['experts']:.1f}%)")
    if worst is not None and "capacity_factor" in b:
        lines[-1] += _dropped_clause(b)
    return lines


def _rows_clause(b: dict, kept: list[int]) -> str:
    """The rows a MoE layer's experts run over: every routed row, or under a capacity cap
    the routed rows and those kept (on average over the layers)."""
    per_token = f"({b['experts_per_token']} per token)"
    if "capacity_factor" not in b:
        return f"{kept[0]} rows per MoE layer {per_token}"
    return f"{b['routed_rows'][0]} rows routed per MoE layer {per_token}, {sum(kept) / len(kept):.1f} kept"


def _dropped_clause(b: dict) -> str:
    """The routing line's tail under a capacity cap: the rows dropped."""
    dropped, share = b["dropped_rows"], b["dropped_share"]
    return (f"; capacity factor {b['capacity_factor']:g} ({b['expert_capacity_rows']} rows per expert): "
            f"{sum(dropped) / len(dropped):.1f} rows dropped per MoE layer on average "
            f"({100 * sum(dropped) / sum(b['routed_rows']):.1f}%, {100 * max(share):.1f}% at most; "
            "their tokens get only the shared experts and the residual)")


__all__ = ["PARTS", "moe_breakdown", "moe_lines", "moe_part", "routing_rows"]
