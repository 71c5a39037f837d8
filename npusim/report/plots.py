"""Plots of simulated runs (matplotlib, written as PNG and SVG).

One function per plot; each takes what it draws (a GraphRun, an OpReport, a
RunResult, a Comparison or sweep rows) and a directory, writes NAME.png and
NAME.svg there and returns the two paths:

    roofline       a dot per kernel at (FLOPs / GM byte, FLOP/s) under the chip's ceilings
    timeline       one kernel's instructions on its cores' pipes (needs an "instr" trace)
    hotspots       total kernel time per op type
    memory         device memory in use over the step, the peak marked
    before_after   total kernel time per op type, pipeline by pipeline (a Comparison)
    waterfall      each pass's gain, from the baseline latency to the optimized one
    sweep_curves   latency and tokens/s against each swept parameter

Figures are built on matplotlib's Figure directly (no pyplot), so plotting never
changes the backend of a notebook or needs a display. The plots of parallel plans
are in npusim.parallel.plots, those of a service in npusim.serving.plots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from npusim.engine import RunResult
from npusim.hw import HwConfig
from npusim.hw.derived import derive
from npusim.outputs import atomic_write
from npusim.report.step import memory_in_use

FORMATS = ("png", "svg")
DPI = 120  # PNG resolution: sharp on a screen, small enough to commit next to a README
SVG_SALT = "npusim"  # of the SVG's ids (matplotlib's default: a random one per file)
COLOURMAP_SMALL, COLOURMAP_LARGE = "tab10", "tab20"  # qualitative colours for op types
TERA = 1e12
MIB = 1 << 20
GIB = 1 << 30
TIMELINE_CORES_PER_TYPE = 2  # a kernel on 48 cores is unreadable; its first cores of each type show the pattern
WAIT_PREFIXES = ("WaitFlag", "PipeBarrier", "SyncAll", "Wait")  # trace names of time a pipe spent blocked
WAIT_KIND, WAIT_COLOUR = "wait (flag / barrier)", "#dddddd"  # waits in light grey: the work stands out
ROOFLINE_X_MARGIN = 10.0  # the x axis extends this factor beyond the dots and the ridge points
WATERFALL_GAIN, WATERFALL_LOSS, WATERFALL_TOTAL = "tab:green", "tab:red", "tab:blue"


# ---- helpers


def _save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write the figure as NAME.png and NAME.svg in out_dir (created if missing, by
    atomic_write: an all_or_none block that fails removes it again). The same figure
    gives the same bytes: the SVG has no date, and its ids are not salted at random."""
    import matplotlib

    out = Path(out_dir)
    paths = []
    for fmt in FORMATS:
        path = out / f"{name}.{fmt}"
        with atomic_write(path, "wb") as f, matplotlib.rc_context({"svg.hashsalt": SVG_SALT}):
            fig.savefig(f, format=fmt, dpi=DPI, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    return paths


def _colours(names: Iterable[str]) -> dict[str, tuple]:
    """A stable colour per name (sorted, so the same op type gets the same colour in every plot of a run)."""
    import matplotlib

    names = sorted(set(names))
    cmap = matplotlib.colormaps[COLOURMAP_SMALL if len(names) <= 10 else COLOURMAP_LARGE]
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def _result_of(source) -> RunResult:
    """The RunResult inside a GraphRun (.result), an OpReport (.run) or a RunResult itself."""
    if isinstance(source, RunResult):
        return source
    for attr in ("result", "run"):
        inner = getattr(source, attr, None)
        if isinstance(inner, RunResult):
            return inner
    raise TypeError(f"expected a GraphRun, OpReport or RunResult, got {type(source).__name__}")


def _time_by_type(result: RunResult) -> dict[str, float]:
    """Total kernel time (µs) per op type."""
    out: dict[str, float] = {}
    for k in result.kernels:
        out[k.op_type] = out.get(k.op_type, 0.0) + result.hw.us(k.cycles)
    return out


def _title_of(source) -> str:
    """What ran, in one line: the workload step for a GraphRun, the op for an OpReport."""
    graph = getattr(source, "graph", None)
    if graph is not None:
        name = getattr(graph.workload, "name", "graph")
        return f"{name} {graph.phase}, batch {graph.batch} x {graph.context}, on {source.hw.name}"
    lowered = getattr(source, "lowered", None)
    if lowered is not None:
        return f"{lowered.op_type} on {source.hw.name}"
    return f"run on {_result_of(source).hw.name}"


# ---- roofline


def _ceilings(hw: HwConfig) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(compute peaks in FLOP/s, bandwidths in byte/s) the roofline draws, labelled."""
    d = derive(hw)
    peaks = [("cube peak (fp16)", d.cube_peak_flops_per_s["fp16"]),
             ("vector peak (fp16)", d.vector_peak_ops_per_s["fp16"])]
    bws = [(f"HBM {d.hbm_sustained_bw_bytes_per_s / TERA:.2f} TB/s sustained", d.hbm_sustained_bw_bytes_per_s),
           (f"L2 {d.l2_bw_bytes_per_s / TERA:.2f} TB/s", d.l2_bw_bytes_per_s)]
    return peaks, bws


def roofline_points(source) -> list[tuple[str, float, float]]:
    """(op type, FLOPs per GM byte, FLOP/s) per kernel that did FLOPs and moved GM bytes
    (a copy, cache write or embedding has no FLOPs: it has no place on a log-log roofline)."""
    result = _result_of(source)
    out = []
    for k in result.kernels:
        s = k.stats
        seconds = result.hw.us(k.cycles) * 1e-6
        if s.flops > 0 and s.gm_bytes > 0 and seconds > 0:
            out.append((k.op_type, s.flops / s.gm_bytes, s.flops / seconds))
    return out


def _op_point(source) -> tuple[float, float] | None:
    """An OpReport's own dot: its FLOPs per GM byte and FLOP/s over the op's time
    (what `npusim op` prints as TFLOPS: it counts the kernel start cost too)."""
    lowered = getattr(source, "lowered", None)
    if lowered is None or not lowered.flops or not source.stats.gm_bytes or not source.seconds:
        return None
    return lowered.flops / source.stats.gm_bytes, lowered.flops / source.seconds


def roofline(source, out_dir: str | Path, name: str = "roofline") -> list[Path]:
    """Log-log roofline of a GraphRun, OpReport or RunResult: a dot per kernel at
    (FLOPs / GM bytes, achieved FLOP/s), coloured by op type, under the cube and
    vector peaks and the HBM (sustained) and L2 bandwidth ceilings of its config.
    A dot on a diagonal is bound by that link; on a horizontal, by that unit."""
    result = _result_of(source)
    points = roofline_points(result)
    peaks, bws = _ceilings(result.hw)
    top = max(p for _, p in peaks)
    ridges = [top / bw for _, bw in bws]
    xs = [x for _, x, _ in points] + ridges
    x_lo, x_hi = min(xs) / ROOFLINE_X_MARGIN, max(xs) * ROOFLINE_X_MARGIN
    fig = Figure(figsize=(9, 6))
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    for label, peak in peaks:
        ax.axhline(peak / TERA, color="black", linestyle="-" if peak == top else "--", linewidth=1)
        ax.annotate(f"{label} {peak / TERA:,.1f} TFLOP/s", (x_lo, peak / TERA), xytext=(4, 3),
                    textcoords="offset points", fontsize=8)
    for (label, bw), style in zip(bws, ("-", ":")):
        x_end = top / bw
        ax.plot([x_lo, x_end], [bw * x_lo / TERA, top / TERA], color="grey", linestyle=style, linewidth=1.2,
                label=label)
    colours = _colours(t for t, _, _ in points)
    for op_type, colour in colours.items():
        mine = [(x, y) for t, x, y in points if t == op_type]
        ax.scatter([x for x, _ in mine], [y / TERA for _, y in mine], color=colour, s=28, alpha=0.8,
                   edgecolors="black", linewidths=0.3, label=f"{op_type} ({len(mine)})", zorder=3)
    op = _op_point(source)
    if op is not None:
        x, y = op
        ax.scatter([x], [y / TERA], marker="*", s=160, color="gold", edgecolors="black", linewidths=0.5, zorder=4,
                   label="the whole op (time incl. kernel start)")
        x_lo, x_hi = min(x_lo, x / ROOFLINE_X_MARGIN), max(x_hi, x * ROOFLINE_X_MARGIN)
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("operational intensity (FLOPs per GM byte)")
    ax.set_ylabel("achieved TFLOP/s (FLOPs / kernel time)")
    skipped = len(result.kernels) - len(points)
    note = f"; {skipped} kernels without FLOPs not shown" if skipped else ""
    ax.set_title(f"Roofline: {_title_of(source)}\n{len(points)} kernel(s){note}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="ceilings / op type (kernels)")
    return _save(fig, out_dir, name)


# ---- pipe timeline of one kernel


def longest_kernel(result: RunResult):
    """The kernel record that ran longest on the cores (ties: the first); a collective's
    transfer steps (on the links, engine.links) have no pipes to show."""
    from npusim.isa.program import CoreType

    on_cores = [k for k in result.kernels if k.core_type in {c.value for c in CoreType}]
    return max(on_cores or result.kernels, key=lambda k: (k.cycles, -k.id))


def _core_key(core: str) -> tuple[str, int]:
    """AIC2 < AIC10: cores sort by type, then by number."""
    m = re.match(r"([A-Za-z]+)(\d+)$", core)
    return (m.group(1), int(m.group(2))) if m else (core, 0)


def _pick_cores(cores: Iterable[str], per_type: int) -> list[str]:
    """The first `per_type` cores of each core type, in order."""
    picked, seen = [], {}
    for core in sorted(set(cores), key=_core_key):
        kind = _core_key(core)[0]
        if seen.get(kind, 0) < per_type:
            picked.append(core)
            seen[kind] = seen.get(kind, 0) + 1
    return picked


def _instr_kind(name: str) -> str:
    """What colours a bar: waits are one kind, other instructions go by their name."""
    return WAIT_KIND if name.startswith(WAIT_PREFIXES) else name


def timeline(result: RunResult, out_dir: str | Path, kernel: str | int | None = None, name: str = "timeline",
             cores_per_type: int = TIMELINE_CORES_PER_TYPE, label: str | None = None) -> list[Path]:
    """Pipe timeline of one kernel (by name or id; default the longest): a row per
    core.pipe, a bar per instruction, coloured by instruction, time in µs from the
    kernel's start. Needs a run traced at level "instr". Only the first
    `cores_per_type` cores of each type are drawn; the others run the same program.
    `label`: what the title calls the kernel (default its name)."""
    if result.trace.level != "instr":
        raise ValueError(f"timeline: needs a run traced at level 'instr', got '{result.trace.level}'")
    rec = _kernel_record(result, kernel)
    mine = result.trace.intervals_of(rec.id)  # a memoised copy's: its source's, moved
    if not mine:
        raise ValueError(f"timeline: kernel '{rec.name}' recorded no instructions")
    all_cores = {iv[0] for iv in mine}
    cores = _pick_cores(all_cores, cores_per_type)
    rows = sorted({(iv[0], iv[1]) for iv in mine if iv[0] in cores}, key=lambda r: (_core_key(r[0]), r[1]),
                  reverse=True)
    row_of = {r: i for i, r in enumerate(rows)}
    kinds = {_instr_kind(iv[2]) for iv in mine if iv[0] in cores}
    colours = _colours(kinds - {WAIT_KIND}) | ({WAIT_KIND: WAIT_COLOUR} if WAIT_KIND in kinds else {})
    us = result.hw.us
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for core, pipe, instr, start, end, _ in mine:
        if core in cores:
            bars.setdefault((row_of[(core, pipe)], _instr_kind(instr)), []).append(
                (us(start - rec.start), max(us(end - start), 0.0)))
    fig = Figure(figsize=(11, 1.2 + 0.35 * len(rows)))
    ax = fig.add_subplot()
    for (row, kind), spans in sorted(bars.items()):
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colours[kind])
    ax.set_yticks(range(len(rows)), [f"{c}.{p}" for c, p in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, result.hw.us(rec.cycles))
    ax.set_xlabel("time since the kernel started (µs)")
    ax.set_ylabel("core.pipe")
    shown = ", ".join(cores)
    ax.set_title(f"Pipe timeline of {label or rec.name} ({rec.op_type}, {rec.core_type}, block_dim {rec.block_dim}) "
                 f"on {result.hw.name}: {result.hw.us(rec.cycles):,.1f} µs\n"
                 f"cores shown: {shown} (of {len(all_cores)} traced)", fontsize=10)
    handles = [_patch(c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="instruction")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, out_dir, name)


def _patch(colour):
    from matplotlib.patches import Patch

    return Patch(facecolor=colour)


def _kernel_record(result: RunResult, kernel: str | int | None):
    if kernel is None:
        return longest_kernel(result)
    for k in result.kernels:
        if k.id == kernel or k.name == kernel:
            return k
    raise ValueError(f"timeline: no kernel {kernel!r} in the run")


def run_timeline(run, out_dir: str | Path, kernel: str | None = None, name: str = "timeline") -> list[Path]:
    """Pipe timeline of one kernel of a GraphRun (by name; default the longest). A
    step is traced at kernel level (an instruction trace of every kernel would be
    huge), so the kernel the run lowered for it (at its bound addresses) is simulated
    again alone, at instruction level, on an idle device with a cold L2."""
    from npusim.engine import simulate

    rec = _kernel_record(run.result, kernel)
    alone = simulate(run.kernel(rec), run.hw, trace="instr")
    return timeline(alone, out_dir, name=name, label=f"{rec.name} (simulated alone)")


# ---- hotspots


def hotspots(source, out_dir: str | Path, name: str = "hotspots") -> list[Path]:
    """Horizontal bars of total kernel time per op type, largest on top, each
    labelled with its share of all kernel time and its kernel count."""
    result = _result_of(source)
    total = _time_by_type(result)
    counts: dict[str, int] = {}
    for k in result.kernels:
        counts[k.op_type] = counts.get(k.op_type, 0) + 1
    ranked = sorted(total, key=lambda t: total[t])
    all_us = sum(total.values()) or 1.0
    colours = _colours(total)
    fig = Figure(figsize=(9, 1.5 + 0.35 * len(ranked)))
    ax = fig.add_subplot()
    ax.barh(ranked, [total[t] for t in ranked], color=[colours[t] for t in ranked])
    for i, t in enumerate(ranked):
        ax.annotate(f" {total[t]:,.1f} µs, {100 * total[t] / all_us:.1f}%  ({counts[t]} kernels)", (total[t], i), va="center",
                    fontsize=8)
    ax.set_xlabel("total kernel time (µs)")
    ax.set_ylabel("op type")
    ax.set_xlim(0, max(total.values(), default=1.0) * 1.4)  # room for the labels
    ax.set_title(f"Hotspots by op type: {_title_of(source)}\nkernel time {all_us:,.1f} µs, step latency "
                 f"{result.us:,.1f} µs", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, out_dir, name)


# ---- memory over time


def memory(run, out_dir: str | Path, name: str = "memory") -> list[Path]:
    """Two panels over the step of a GraphRun: all device memory in use (weights, KV
    cache, workspace and activations), its peak marked; and the activations alone
    (they are MiB beside GiB of weights), with what the run reserves for them -
    the memory plan's pool, or the eager allocator's high-water mark without a plan."""
    times, live, total, static = memory_in_use(run)
    fig = Figure(figsize=(10, 7))
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    ax.plot(times, [v / GIB for v in total], drawstyle="steps-post", color="tab:blue", label="in use")
    i = max(range(len(total)), key=total.__getitem__)
    ax.plot([times[i]], [total[i] / GIB], "o", color="tab:red",
            label=f"peak {total[i] / GIB:,.3f} GiB at {times[i]:,.1f} µs")
    ax.axhline(run.memory.capacity_bytes / GIB, color="black", linestyle=":",
               label=f"device memory {run.memory.capacity_bytes / GIB:,.0f} GiB")
    parts = ", ".join(f"{k} {v / GIB:,.3f} GiB" for k, v in static.items() if v)
    ax.set_ylabel("in use (GiB)")
    ax.set_ylim(0, run.memory.capacity_bytes / GIB * 1.05)
    ax.set_title(f"Device memory over the step: {_title_of(run)}\nheld all step: {parts}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, alpha=0.3)
    ax2.plot(times, [v / MIB for v in live], drawstyle="steps-post", color="tab:green", label="live activations")
    j = max(range(len(live)), key=live.__getitem__)
    ax2.plot([times[j]], [live[j] / MIB], "o", color="tab:red", label=f"peak {live[j] / MIB:,.3f} MiB")
    reserved = "memory plan pool" if run.graph.memory_plan is not None else "eager allocator (no plan)"
    ax2.axhline(run.memory.activation_bytes / MIB, color="black", linestyle="--",
                label=f"reserved: {reserved} {run.memory.activation_bytes / MIB:,.3f} MiB")
    ax2.set_xlabel("time (µs)")
    ax2.set_ylabel("activations (MiB)")
    ax2.set_ylim(0, max(max(live), run.memory.activation_bytes) / MIB * 1.15 or 1.0)
    ax2.legend(fontsize=8, loc="upper right")
    ax2.grid(True, alpha=0.3)
    return _save(fig, out_dir, name)


# ---- comparisons


def before_after(comparison, out_dir: str | Path, name: str = "before_after") -> list[Path]:
    """Grouped bars: total kernel time per op type for each pipeline of a Comparison
    (baseline vs optimized), op types by their largest time."""
    per_run = {label: _time_by_type(r.result) for label, r in comparison.runs.items()}
    types = sorted({t for d in per_run.values() for t in d}, key=lambda t: max(d.get(t, 0.0) for d in per_run.values()))
    n = len(per_run)
    height = 0.8 / n
    fig = Figure(figsize=(10, 1.5 + 0.3 * n * len(types)))
    ax = fig.add_subplot()
    colours = _colours(per_run)
    for j, (label, d) in enumerate(per_run.items()):
        run = comparison.runs[label]
        ys = [i + (j - (n - 1) / 2) * height for i in range(len(types))]
        ax.barh(ys, [d.get(t, 0.0) for t in types], height=height, color=colours[label],
                label=f"{label}: latency {run.latency_us:,.1f} µs, {len(run.result.kernels)} kernels")
    ax.set_yticks(range(len(types)), types, fontsize=8)
    ax.set_xlabel("total kernel time (µs)")
    ax.set_ylabel("op type")
    first = next(iter(comparison.runs.values()))
    ax.set_title(f"Kernel time per op type: {_title_of(first)}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, out_dir, name)


def waterfall_steps(comparison) -> list[tuple[str, float, float]]:
    """(label, bar bottom, bar top) in µs: the baseline latency, each pass's change
    in order (comparison.steps), and the final latency."""
    first = next(iter(comparison.runs.values()))
    base = comparison.runs.get("baseline", first).latency_us
    out = [("baseline", 0.0, base)]
    prev = base
    for pass_name, r in comparison.steps.items():
        out.append((f"+ {pass_name}", prev, r.latency_us))
        prev = r.latency_us
    out.append(("optimized" if comparison.steps else "final", 0.0, prev))
    return out


def waterfall(comparison, out_dir: str | Path, name: str = "waterfall") -> list[Path]:
    """Waterfall of a Comparison: the baseline latency, then each pass added in
    pipeline order as a bar from the latency before it to the latency after it
    (green: faster, red: slower, labelled with the change), then the final latency."""
    steps = waterfall_steps(comparison)
    fig = Figure(figsize=(1.6 + 1.1 * len(steps), 5.5))
    ax = fig.add_subplot()
    top = max(max(a, b) for _, a, b in steps)
    for i, (label, lo, hi) in enumerate(steps):
        total = i in (0, len(steps) - 1)
        colour = WATERFALL_TOTAL if total else (WATERFALL_GAIN if hi <= lo else WATERFALL_LOSS)
        ax.bar(i, abs(hi - lo) if not total else hi, bottom=min(lo, hi) if not total else 0.0, color=colour)
        text = f"{hi:,.0f}" if total else f"{hi - lo:+,.0f}\n({100 * (hi - lo) / lo:+.1f}%)" if lo else ""
        ax.annotate(text, (i, max(lo, hi)), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        if not total and i + 1 < len(steps):
            ax.plot([i - 0.4, i + 1.4], [hi, hi], color="grey", linewidth=0.6)  # connector to the next bar
    ax.set_xticks(range(len(steps)), [label for label, _, _ in steps], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("step latency (µs)")
    ax.set_ylim(0, top * 1.15)
    first = next(iter(comparison.runs.values()))
    ax.set_title(f"Each pass's gain, in pipeline order: {_title_of(first)}", fontsize=10)
    ax.legend([_patch(WATERFALL_TOTAL), _patch(WATERFALL_GAIN), _patch(WATERFALL_LOSS)],
              ["latency", "pass made it faster", "pass made it slower"], fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, out_dir, name)


# ---- sweeps

SWEEP_METRICS = (("latency_us", "latency (µs)"), ("tokens_per_s", "tokens/s"))
SWEEP_MAX_TICKS = 8  # up to this many values each gets its own tick, labelled as given


def _numeric(values: Sequence) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def sweep_curves(rows: Sequence[dict], params: Sequence[str], out_dir: str | Path, name: str = "sweep",
                 title: str = "") -> list[Path]:
    """Small multiples of a sweep: a column per swept parameter, a row per metric
    (latency, tokens/s); in each panel a line per combination of the other
    parameters' values. Failed points (status not "ok") are left out and counted
    in the title; a point without a value for a parameter (a point of another
    grid) is left out of that parameter's column."""
    params = list(params)
    ok = [r for r in rows if r.get("status") == "ok"]
    fig = Figure(figsize=(5.2 * max(len(params), 1) + 1.0, 7.5), layout="constrained")
    axes = fig.subplots(len(SWEEP_METRICS), max(len(params), 1), squeeze=False)
    for col, p in enumerate(params):
        others = [q for q in params if q != p]
        values = list(dict.fromkeys(r[p] for r in rows if r.get(p) is not None))
        numeric = _numeric(values)
        groups: dict[tuple, list[dict]] = {}
        for r in ok:
            if r.get(p) is not None:
                groups.setdefault(tuple(r.get(q) for q in others), []).append(r)
        for row, (metric, label) in enumerate(SWEEP_METRICS):
            ax = axes[row][col]
            for key, members in groups.items():
                xs = [r[p] if numeric else values.index(r[p]) for r in members]
                order = sorted(range(len(xs)), key=xs.__getitem__)
                legend = ", ".join(f"{q}={_short(v)}" for q, v in zip(others, key)) or "all points"
                ax.plot([xs[i] for i in order], [members[i][metric] for i in order], marker="o", label=legend)
            if not numeric:
                ax.set_xticks(range(len(values)), [_short(v) for v in values])
            elif len(values) <= SWEEP_MAX_TICKS:
                ax.set_xticks(values, [_short(v) for v in values])
            ax.set_ylabel(label)
            ax.set_xlabel(p)
            ax.grid(True, alpha=0.3)
            if row == 0 and groups:
                ax.legend(fontsize=7)
    failed = len(rows) - len(ok)
    note = f"; {failed} failed point(s) not shown (see the CSV)" if failed else ""
    fig.suptitle(f"{title or 'Sweep'}: {len(rows)} points{note}", fontsize=10)
    return _save(fig, out_dir, name)


def _short(v) -> str:
    """A parameter value short enough for a legend: 1.6e12, 24, 2.01e8; no value is "default"."""
    if v is None:
        return "default"
    if isinstance(v, float) and (abs(v) >= 1e5 or (v and abs(v) < 1e-3)):
        return f"{v:.3g}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1e6:
        exponent = int(math.log10(abs(v)))
        return f"{v / 10**exponent:.3g}e{exponent}"
    return str(v)


__all__ = ["FORMATS", "before_after", "hotspots", "longest_kernel", "memory", "roofline", "roofline_points",
           "run_timeline", "sweep_curves", "timeline", "waterfall", "waterfall_steps"]
