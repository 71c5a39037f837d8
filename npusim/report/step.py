"""Reports of a simulated decoder step: the console summary, the JSON contract,
the weight-read floor analysis and the side-by-side comparison."""

from __future__ import annotations

from attrs import frozen

from npusim.passes.buckets import distinct_kernels, first_run_compile_us, padding
from npusim.report.contract import run_json
from npusim.runtime.decoder import Comparison
from npusim.runtime.memory import size
from npusim.runtime.run import GraphRun

GB = 1e9
MIB = 1 << 20


@frozen
class Floor:
    """Where a step's time goes relative to reading every weight once from HBM.

    floor_us: weight bytes / sustained HBM bandwidth - no step can be faster.
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


def floor_of(run: GraphRun) -> Floor:
    hw = run.hw
    s = run.result.stats
    bw = hw.hbm_bytes_per_cycle
    weights = run.memory.weights_bytes
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


def _title(run: GraphRun) -> str:
    g = run.graph
    lengths = g.lengths[0] if len(set(g.lengths)) == 1 else f"{min(g.lengths)}..{max(g.lengths)}"
    what = "context" if g.phase == "decode" else "prompt"
    passes = ", ".join(g.applied) or "none"
    return (f"{g.workload.name} {g.phase} on {run.hw.name}: batch {g.batch} x {what} {lengths}, "
            f"passes: {passes}" + ("" if run.memo else " (every layer simulated)"))


def summary(run: GraphRun, top: int = 5) -> str:
    r, hw, m = run.result, run.hw, run.memory
    s = r.stats
    f = floor_of(run)
    lines = [
        _title(run),
        f"  latency        {run.latency_us:,.1f} us ({r.cycles:,.0f} cycles), {run.tokens_per_s:,.1f} tokens/s",
        f"  HBM traffic    read {s.hbm_read_bytes / GB:.3f} GB, write {s.hbm_write_bytes / GB:.3f} GB "
        f"({r.hbm_bw_bytes_per_s / 1e12:.3f} TB/s); L2 hit rate {100 * s.l2_hit_rate:.1f}%",
        f"  peak memory    {size(m.total_bytes)}: {m.line()}",
        f"  kernels        {len(r.kernels)}",
        f"  host           launch {hw.us(r.host_launch_cycles):,.1f} us, wait {hw.us(r.host_wait_cycles):,.1f} us "
        "(blocked in synchronize: the device was behind)",
        f"  weight floor   {f.floor_us:,.1f} us (weights / sustained HBM bandwidth); this step is "
        f"{f.ratio:.2f}x it: + other HBM traffic {f.other_hbm_us:,.1f} us, + device idle {f.idle_us:,.1f} us, "
        f"+ kernels slower than their traffic {f.kernel_excess_us:,.1f} us",
        "  top op types   " + "; ".join(f"{t} {us:,.1f} us ({c})" for t, c, us in by_type(run)[:top]),
        f"  shapes         {_shapes(run)}",
    ]
    workspaces = _workspaces(run)
    if workspaces:
        lines.append("  workspace      " + "; ".join(workspaces))
    return "\n".join(lines)


def _shapes(run: GraphRun) -> str:
    g = run.graph
    what = "context" if g.phase == "decode" else "prompt"
    return (f"{what} {g.context} for lengths {min(g.lengths)}..{max(g.lengths)}: {100 * padding(g):.1f}% padding; "
            f"the first run of a new shape compiles {distinct_kernels(g)} kernels: "
            f"{first_run_compile_us(g, run.hw) / 1e3:,.0f} ms on the host")


def _workspaces(run: GraphRun, top: int = 3) -> list[str]:
    """The fused kernels that need GM workspace beyond their operands, largest first."""
    sizes: dict[str, int] = {}
    for k in run.result.kernels:
        node = run.node_of.get(k.name)
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
    })


_ROWS = (
    ("latency (us)", lambda r: r.latency_us),
    ("tokens/s", lambda r: r.tokens_per_s),
    ("kernels", lambda r: len(r.result.kernels)),
    ("trans_data kernels", lambda r: sum(1 for k in r.result.kernels if k.op_type == "trans_data")),
    ("GM bytes (GB)", lambda r: r.result.stats.gm_bytes / GB),
    ("HBM bytes (GB)", lambda r: (r.result.stats.hbm_read_bytes + r.result.stats.hbm_write_bytes) / GB),
    ("DMA segments", lambda r: r.result.stats.dma_segments),
    ("wasted burst bytes", lambda r: r.result.stats.wasted_burst_bytes),
    ("peak memory (MiB)", lambda r: r.memory.total_bytes / MIB),
    ("host launch (us)", lambda r: r.hw.us(r.result.host_launch_cycles)),
    ("host wait (us)", lambda r: r.hw.us(r.result.host_wait_cycles)),
)


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:,.3f}"


def comparison_table(c: Comparison) -> str:
    """The pipelines side by side, then each pass's gain (added in pipeline order)."""
    names = list(c.runs)
    first = next(iter(c.runs.values()))
    lines = [_title(first).split(", passes:")[0], "", f"  {'':22s}" + "".join(f"{n:>16s}" for n in names)]
    for label, get in _ROWS:
        lines.append(f"  {label:22s}" + "".join(f"{_fmt(get(r)):>16s}" for r in c.runs.values()))
    lines += ["", "  each pass added in order (latency, then the figure it targets):"]
    prev = c.runs.get("baseline", first)
    for name, r in c.steps.items():
        change = r.latency_us - prev.latency_us
        lines.append(f"  + {name:12s} {r.latency_us:>14,.1f} us  ({change:+,.1f} us, {100 * change / prev.latency_us:+.1f}%)"
                     f"  {_target(name, prev, r)}")
        prev = r
    return "\n".join(lines)


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
    }.get(name)
    if pick is None:
        return ""
    label, get = pick
    return f"{label} {_fmt(get(before))} -> {_fmt(get(after))}"




def memory_timeline(run: GraphRun) -> list[tuple[float, float]]:
    """(cycle, bytes of device memory in use) steps over the step: weights, KV cache
    and workspace from the start; with a memory plan its whole pool from the start;
    without one, each activation from the start of the kernel that writes it (host
    inputs from the start) to the end of the step, as separate allocations hold it.
    The last value is the step's peak (MemoryBreakdown.total_bytes)."""
    g, m = run.graph, run.memory
    base = m.weights_bytes + m.kv_bytes + m.workspace_bytes
    if g.memory_plan is not None:
        return [(0.0, base + m.activation_bytes), (run.result.cycles, base + m.activation_bytes)]
    start: dict[str, float] = {}
    for r in run.result.kernels:
        node = r.name.split("/")[0]
        start[node] = min(start.get(node, r.start), r.start)
    allocs = sorted((start.get(n.name, 0.0), g.tensors[t].nbytes) for n in g.nodes for t in n.outputs.values()
                    if g.tensors[t].kind in ("activation", "output"))
    used = base + m.activation_bytes - sum(b for _, b in allocs)  # inputs (and alignment) from the start
    steps = [(0.0, used)]
    for at, nbytes in allocs:
        used += nbytes
        steps.append((at, used))
    steps.append((run.result.cycles, base + m.activation_bytes))
    return steps


__all__ = ["Floor", "by_type", "comparison_table", "floor_of", "memory_timeline", "step_json", "summary"]
