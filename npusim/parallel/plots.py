"""The plot of parallel plans (report.plots' conventions: a Figure, PNG and SVG):
latency and communication share against the devices of each plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from npusim.report.plots import _save

LOG_SPAN = 10.0  # latencies spanning more than this factor are drawn on a log axis
PLOT_HEADROOM = 0.12  # room above the highest point for its value


def plan_scaling(curves: Mapping[str, Sequence[tuple[str, int, float, float]]], out_dir: str | Path,
                 name: str = "plan_scaling", title: str = "") -> list[Path]:
    """Latency (left; a log scale when the latencies span more than LOG_SPAN) and communication share (right) against the devices of
    each parallel plan: a line per step in `curves` (label -> points (plan name, devices,
    latency µs, communication share)), the x ticks naming the plans at each device count."""
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    lat, share = fig.subplots(1, 2)
    ticks: dict[int, list[str]] = {}
    for label, points in curves.items():
        pts = sorted(points, key=lambda p: p[1])
        xs = [p[1] for p in pts]
        lat.plot(xs, [p[2] for p in pts], marker="o", label=label)
        for x, p in zip(xs, pts):
            lat.annotate(f"{p[2]:,.0f}", (x, p[2]), xytext=(0, 4), textcoords="offset points", ha="center",
                         fontsize=7)
        share.plot(xs, [100 * p[3] for p in pts], marker="o", label=label)
        for plan, devices, _, _ in pts:
            ticks.setdefault(devices, []).append(plan)
    values = [p[2] for points in curves.values() for p in points]
    if values and max(values) > LOG_SPAN * min(values):
        lat.set_yscale("log")
    elif values:
        lat.set_ylim(0, max(values) * (1 + PLOT_HEADROOM))
    lat.set(ylabel="step latency (µs)", title="latency")
    share.set(ylabel="communication share of the step (%)", title="communication share")
    share.set_ylim(bottom=0)
    for ax in (lat, share):
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(sorted(ticks), ["/".join(dict.fromkeys(ticks[d])) for d in sorted(ticks)])
        ax.set_xlabel("plan (devices on a log scale)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "Latency and communication share against the plan's devices", fontsize=10)
    return _save(fig, out_dir, name)
