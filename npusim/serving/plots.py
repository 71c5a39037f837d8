"""Plots of a serving run (report.plots' conventions: a Figure, PNG and SVG):
the latency CDFs (TTFT, TPOT, end-to-end) and the decode batch and KV-cache
occupancy over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from npusim.report.plots import _save
from npusim.serving.report import timeline
from npusim.serving.simulate import ServingRun


def latency_cdf(run: ServingRun, out_dir: str | Path) -> list[Path]:
    ok = [s for s in run.seqs if s.status == "ok"]
    series = {
        "TTFT": [s.token_us[0] - s.arrival_us for s in ok],
        "TPOT": [(s.token_us[-1] - s.token_us[0]) / (len(s.token_us) - 1) for s in ok if len(s.token_us) > 1],
        "end-to-end": [s.done_us - s.arrival_us for s in ok],
    }
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for name, values in series.items():
        if values:
            v = np.sort(np.asarray(values) / 1e3)
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of completed requests")
    ax.set_title(f"{run.service.name} on {run.cost.workload.name}: latency CDF")
    ax.grid(True, alpha=0.3)
    if ax.get_lines():  # no request completed: no curve to name (legend() warned on stderr)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no completed requests", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, out_dir, "latency_cdf")


def batch_and_kv(run: ServingRun, out_dir: str | Path) -> list[Path]:
    t = timeline(run)
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot(t["t_s"], t["decode_batch"], label="decode batch")
    ax.set_xlabel("s")
    ax.set_ylabel("sequences per decode step (time-weighted)")
    kv = ax.twinx()
    kv.plot(t["t_s"], [100 * x for x in t["kv_occupancy"]], color="tab:red", label="KV cache in use")
    kv.set_ylabel("KV cache in use, % of capacity")
    ax.set_title(f"{run.service.name} on {run.cost.workload.name}: batch and KV cache over time")
    lines = ax.get_lines() + kv.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="lower center")
    return _save(fig, out_dir, "batch_kv")


__all__ = ["batch_and_kv", "latency_cdf"]
