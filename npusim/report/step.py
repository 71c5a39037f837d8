"""Reports of a simulated decoder step: the console summary, the JSON contract,
the weight-read floor analysis and the side-by-side comparison."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from npusim.graph.lifetimes import PLANNED_KINDS
from npusim.passes.buckets import distinct_kernels, first_run_compile_us, padding
from npusim.report.contract import run_json, set_note
from npusim.report.moe import moe_breakdown, moe_lines
from npusim.runtime.decoder import Comparison
from npusim.runtime.memory import size
from npusim.runtime.run import GraphRun

GB = 1e9
MIB = 1 << 20
# compare checks a run with numpy only when its runs take at most this much host
# memory (assumed: a few seconds of numpy; a full-size model is "n/a", not minutes)
SCORE_HOST_BYTES = 1 << 30


@frozen
class Floor:
    """Where a step's time goes relative to reading every weight once from HBM.

    floor_us: bytes of the weights read in full (the embedding table is only gathered
    from; of the experts, those routed to) / sustained HBM bandwidth - no step can be faster.
    other_hbm_us: the rest of the HBM traffic (KV cache, activations) at that bandwidth.
    idle_us: time no kernel ran (host launch and synchronisation gaps, kernel start costs).
    kernel_excess_us: what remains - kernels running slower than their HBM traffic
    (compute, latency, bandwidth not reached)."""

    latency_us: float
    floor_us: float
    other_hbm_us: float
    idle_us: float
    kernel_excess_us: float

    @property
    def ratio(self) -> float:
        return self.latency_us / self.floor_us if self.floor_us else float("inf")


def floor_weight_bytes(graph) -> int:
    """Weight bytes a step must read in full: every weight a node other than an embedding
    reads (an embedding gathers one row of its table per token, not the table); of a
    grouped matmul's expert weights, only the experts that have rows (the routing)."""
    read = {t for n in graph.nodes if n.op_type not in ("embedding", "grouped_matmul") for t in n.inputs.values()}
    experts = {n.inputs["weight"]: n.args.group_sizes for n in graph.nodes if n.op_type == "grouped_matmul"}
    return sum(spec.nbytes for t, spec in graph.tensors.items() if spec.kind == "weight" and t in read) + sum(
        graph.tensors[t].nbytes * sum(1 for g in groups if g) // len(groups)
        for t, groups in experts.items() if t not in read)


def floor_of(run: GraphRun) -> Floor:
    hw = run.hw
    s = run.result.stats
    bw = hw.hbm_bytes_per_cycle
    weights = floor_weight_bytes(run.graph)
    floor = hw.us(weights / bw)
    other = hw.us(max(s.hbm_read_bytes + s.hbm_write_bytes - weights, 0.0) / bw)
    busy, end = 0.0, 0.0
    for r in sorted(run.result.kernels, key=lambda r: r.start):  # union of kernel spans
        if r.end > end:
            busy += r.end - max(r.start, end)
            end = r.end
    idle = hw.us(run.result.cycles - busy)
    return Floor(run.latency_us, floor, other, idle, run.latency_us - floor - other - idle)


def by_type(run: GraphRun) -> list[tuple[str, int, float]]:
    """(op type, kernel count, total µs) by time, largest first."""
    out: dict[str, list] = {}
    for r in run.result.kernels:
        e = out.setdefault(r.op_type, [0, 0.0])
        e[0] += 1
        e[1] += run.hw.us(r.cycles)
    return sorted(((k, c, t) for k, (c, t) in out.items()), key=lambda x: -x[2])


def step_title(run: GraphRun, overrides=None, hw: bool = True) -> str:
    """"k3 decode on ascend910b2 (--set ...): batch 8 x context 4096, passes: ..."; hw=False
    leaves out " on ascend910b2" (a comparison of configs names them in its columns)."""
    g = run.graph
    lengths = g.lengths[0] if len(set(g.lengths)) == 1 else f"{min(g.lengths)}..{max(g.lengths)}"
    what = "context" if g.phase == "decode" else "prompt"
    passes = ", ".join(g.applied) or "none"
    on = f" on {run.hw.name}" if hw else ""
    return (f"{g.workload.name} {g.phase}{on}{set_note(overrides)}: batch {g.batch} x {what} {lengths}, "
            f"passes: {passes}" + ("" if run.memo else " (every layer simulated)"))


def summary(run: GraphRun, top: int = 5, overrides=None) -> str:
    """The console summary; `overrides` (--set KEY=VALUE as given) are named after the hardware's name."""
    r, hw, m = run.result, run.hw, run.memory
    s = r.stats
    f = floor_of(run)
    lines = [
        step_title(run, overrides),
        f"  latency        {run.latency_us:,.1f} us ({r.cycles:,.0f} cycles), {run.tokens_per_s:,.1f} tokens/s",
        f"  HBM traffic    read {s.hbm_read_bytes / GB:.3f} GB, write {s.hbm_write_bytes / GB:.3f} GB "
        f"({r.hbm_bw_bytes_per_s / 1e12:.3f} TB/s); L2 hit rate {100 * s.l2_hit_rate:.1f}%",
        f"  peak memory    {size(m.total_bytes)}: {m.line()}",
        f"  kernels        {len(r.kernels)}" + (f", {note}" if (note := r.fast_forward_note()) else ""),
        f"  host           launch {hw.us(r.host_launch_cycles):,.1f} us, wait {hw.us(r.host_wait_cycles):,.1f} us "
        "(blocked in synchronize: the device was behind)",
        f"  weight floor   {f.floor_us:,.1f} us (weights read in full / sustained HBM bandwidth); this step is "
        f"{f.ratio:.2f}x it: + other HBM traffic {f.other_hbm_us:,.1f} us, + device idle {f.idle_us:,.1f} us, "
        f"+ kernels slower than their traffic {f.kernel_excess_us:,.1f} us",
        "  top op types   " + "; ".join(f"{t} {us:,.1f} us ({c})" for t, c, us in by_type(run)[:top]),
        f"  shapes         {_shapes(run)}",
    ]
    workspaces = _workspaces(run)
    if workspaces:
        lines.append("  workspace      " + "; ".join(workspaces))
    moe = moe_breakdown(run)
    if moe:
        lines += moe_lines(moe)
    return "\n".join(lines)


def _shapes(run: GraphRun) -> str:
    g = run.graph
    what = "context" if g.phase == "decode" else "prompt"
    return (f"{what} {g.context} for lengths {min(g.lengths)}..{max(g.lengths)}: {100 * padding(g):.1f}% padding; "
            f"the first run of a new shape compiles {distinct_kernels(g)} kernels: "
            f"{first_run_compile_us(g, run.hw) / 1e3:,.0f} ms on the host, once (not in this step's latency)")


def _workspaces(run: GraphRun, top: int = 3) -> list[str]:
    """The fused kernels that need GM workspace beyond their operands, largest first."""
    sizes: dict[str, int] = {}
    for k in run.result.kernels:
        node = run.node(k)
        if node is not None:
            sizes[node.op_type] = max(sizes.get(node.op_type, 0), run.workspace.get(k.name, 0))
    ranked = sorted(((t, b) for t, b in sizes.items() if b), key=lambda x: -x[1])
    return [f"{t} needs {size(b)}" for t, b in ranked[:top]]


def step_json(run: GraphRun) -> dict:
    g, f, m = run.graph, floor_of(run), run.memory
    return run_json(run.result, m.total_bytes, run.tokens, extra={
        "workload": g.workload.name, "phase": g.phase, "batch": g.batch, "lengths": list(g.lengths),
        "passes": list(g.applied), "memoised_layers": run.memo,
        "memory": {"weights_bytes": m.weights_bytes, "kv_bytes": m.kv_bytes,
                   "activation_bytes": m.activation_bytes, "workspace_bytes": m.workspace_bytes,
                   "capacity_bytes": m.capacity_bytes},
        "padding_fraction": padding(g), "first_run_compile_us": first_run_compile_us(g, run.hw),
        "workspace_bytes_by_kernel": dict(run.workspace),
        "weight_floor": {"floor_us": f.floor_us, "ratio": f.ratio, "other_hbm_us": f.other_hbm_us,
                         "idle_us": f.idle_us, "kernel_excess_us": f.kernel_excess_us},
    } | ({"moe": moe} if (moe := moe_breakdown(run)) else {}))


_ROWS = (
    ("latency (us)", lambda r: r.latency_us),
    ("tokens/s", lambda r: r.tokens_per_s),
    ("kernels", lambda r: len(r.result.kernels)),
    ("trans_data kernels", lambda r: sum(1 for k in r.result.kernels if k.op_type == "trans_data")),
    ("GM bytes (GB)", lambda r: r.result.stats.gm_bytes / GB),
    ("HBM bytes (GB)", lambda r: (r.result.stats.hbm_read_bytes + r.result.stats.hbm_write_bytes) / GB),
    ("DMA segments", lambda r: r.result.stats.dma_segments),
    ("wasted burst bytes", lambda r: r.result.stats.wasted_burst_bytes),
    ("weight bytes (GB)", lambda r: r.memory.weights_bytes / GB),
    ("L2 hit rate (%)", lambda r: 100 * r.result.stats.l2_hit_rate),
    ("peak memory (MiB)", lambda r: r.memory.total_bytes / MIB),
    ("host launch (us)", lambda r: r.hw.us(r.result.host_launch_cycles)),
    ("host wait (us)", lambda r: r.hw.us(r.result.host_wait_cycles)),
)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:,.3f}"


def comparison_table(c: Comparison, overrides=None) -> str:
    """The runs side by side; then, when the first is the baseline, each pass's gain
    (added in pipeline order); otherwise the kernels of the first run (A) and the last
    (B) that changed most (report.ab). Runs of one pipeline (compare's sides) name it in
    the title; runs on configs of different names name them in the columns only."""
    from npusim.report.ab import kernel_table

    names = list(c.runs)
    first, last = c.runs[names[0]], c.runs[names[-1]]
    one_hw = all(r.hw.name == first.hw.name for r in c.runs.values())  # (what-ifs of one config: its name)
    title = step_title(first, overrides, hw=one_hw)
    if len({r.graph.applied for r in c.runs.values()}) > 1:  # pipelines are the columns
        title = title.split(", passes:")[0]
    w = max(16, *(len(n) + 2 for n in names))  # a column per run, as wide as its name
    lines = [title, "", f"  {'':22s}" + "".join(f"{n:>{w}s}" for n in names)]
    for label, get in _ROWS:
        lines.append(f"  {label:22s}" + "".join(f"{_fmt(get(r)):>{w}s}" for r in c.runs.values()))
    scores = [validation_score(r) for r in c.runs.values()]
    lines.append(f"  {'logits cosine vs FP32':22s}" + "".join(f"{s:>{w}s}" for s in scores))
    if "n/a" in scores:
        lines.append("  (n/a: the numpy check of this shape is too large to run here, or a sequence-parallel step "
                     "with fused attention; npusim validate says which)")
    if c.steps:
        lines += ["", "  each pass added in order (latency, then the figure it targets):"]
        prev = first
        for name, r in c.steps.items():
            change = r.latency_us - prev.latency_us
            lines.append(f"  + {name:12s} {r.latency_us:>14,.1f} us  ({change:+,.1f} us, "
                         f"{100 * change / prev.latency_us:+.1f}%)  {_target(name, prev, r)}")
            prev = r
    elif len(names) > 1:
        lines += ["", kernel_table((names[0], names[-1]), first, last)]
    return "\n".join(lines)


def validation_score(run: GraphRun) -> str:
    """The run's graph checked by numpy (npusim.passes.validate) against an FP32 run of
    the baseline graph of the same step: the logits' cosine and ok / FAIL, or "n/a"
    when the numpy runs would take more than SCORE_HOST_BYTES (a full-size model). A
    shard of a parallel plan is checked as `validate --tp/--sp` checks it: every rank's
    shard with numpy against the unsharded reference ("n/a" where that check refuses)."""
    from npusim.errors import NpusimError
    from npusim.graph.build import build_decoder
    from npusim.parallel.plan import graph_plan
    from npusim.passes.validate import check_host_memory, validate

    g = run.graph
    base = build_decoder(g.workload, g.phase, g.batch, g.lengths)
    try:
        check_host_memory(base, runs=3, limit=SCORE_HOST_BYTES)
    except NpusimError:
        return "n/a"
    plan = graph_plan(g)
    if plan.world > 1:  # one device's shard: every rank's shard with numpy, the collectives across them
        from npusim.parallel.numerics import check_sharded

        try:
            check = check_sharded(g.workload, plan.tp, phase=g.phase, batch=g.batch, context=g.lengths,
                                  sp=plan.sp, shard=g)
        except NpusimError:  # e.g. fused causal attention under sp: npusim validate says why
            return "n/a"
        return f"{check.cosine:.5f} {'ok' if check.passed else 'FAIL'}"
    v = validate(base, lambda _: g)
    logits = next(c for c in v.checks if c.name in g.outputs and c.is_float)
    return f"{logits.transformed:.5f} {'ok' if v.passed else 'FAIL'}"


def _target(name: str, before: GraphRun, after: GraphRun) -> str:
    """The figure a pass is meant to move, before -> after."""
    pick = {
        "fusion": ("kernels", lambda r: len(r.result.kernels)),
        "layout": ("trans_data us", lambda r: sum(r.hw.us(k.cycles) for k in r.result.kernels
                                                   if k.op_type == "trans_data")),
        "kv_layout": ("DMA segments", lambda r: r.result.stats.dma_segments),
        "memplan": ("activation MiB", lambda r: r.memory.activation_bytes / MIB),
        "sync": ("host wait us", lambda r: r.hw.us(r.result.host_wait_cycles)),
        "launch": ("host launch us", lambda r: r.hw.us(r.result.host_launch_cycles)),
        "streams": ("latency us", lambda r: r.latency_us),
        "quantize": ("weight GB", lambda r: r.memory.weights_bytes / GB),
    }.get(name)
    if pick is None:
        return ""
    label, get = pick
    return f"{label} {_fmt(get(before))} -> {_fmt(get(after))}"




def activation_spans(run) -> list[tuple[float, float, int]]:
    """(first cycle, last cycle, bytes) of every activation, host input and output of a
    GraphRun: from its producer kernel's start (inputs: the step's start) to its last
    reader kernel's end (outputs: the step's end)."""
    graph, result = run.graph, run.result
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for k in result.kernels:
        node = run.node(k)
        for t in node.outputs.values():
            first[t] = min(first.get(t, k.start), k.start)
            last[t] = max(last.get(t, k.end), k.end)
        for t in node.inputs.values():
            last[t] = max(last.get(t, k.end), k.end)
    for t in graph.inputs:
        first[t] = 0.0
    for t in graph.outputs:
        last[t] = result.cycles
    spans = []
    for t, end in last.items():
        spec = graph.tensors[t]
        if spec.kind in PLANNED_KINDS:
            spans.append((first.get(t, 0.0), end, spec.nbytes))
    return spans


def live_bytes(spans: Sequence[tuple[float, float, int]]) -> tuple[list[float], list[float]]:
    """The step function of bytes alive: (times, bytes from that time on). A tensor
    freed at the cycle another is allocated is freed first."""
    events = sorted([(a, 1, b) for a, _, b in spans] + [(e, 0, -b) for _, e, b in spans])
    times, values, now = [0.0], [0.0], 0.0
    for t, _, delta in events:
        now += delta
        if t == times[-1]:
            values[-1] = now
        else:
            times.append(t)
            values.append(now)
    return times, values


def memory_in_use(run) -> tuple[list[float], list[float], list[float], dict[str, int]]:
    """Device memory of a GraphRun over its step: (times in µs, live activation bytes,
    total bytes in use, static parts). Weights, KV cache and the kernel workspace are
    held all the step; activations count while alive - or, with a memory plan, as the
    pool the plan reserves for the whole step."""
    m = run.memory
    static = {"weights": m.weights_bytes, "KV cache": m.kv_bytes, "workspace": m.workspace_bytes}
    if run.graph.memory_plan is not None:
        static["activation pool (memory plan)"] = m.activation_bytes
    times, live = live_bytes(activation_spans(run))
    base = sum(static.values())
    planned = run.graph.memory_plan is not None
    total = [base + (0 if planned else v) for v in live]
    times.append(run.result.cycles)  # hold the last value to the step's end
    live.append(live[-1])
    total.append(total[-1])
    return [run.hw.us(t) for t in times], live, total, static


def memory_timeline(run: GraphRun) -> list[tuple[float, float]]:
    """(cycle, bytes of device memory in use) steps over the step (memory_in_use in cycles)."""
    g = memory_in_use(run)
    return [(run.hw.cycles(t * 1e-6), b) for t, b in zip(g[0], g[2])]


__all__ = ["Floor", "step_title", "validation_score", "activation_spans", "floor_weight_bytes", "by_type", "comparison_table", "floor_of", "live_bytes", "memory_in_use",
           "memory_timeline", "step_json", "summary"]
