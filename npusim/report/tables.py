"""Profile tables as msprof writes them: op_summary.csv (one row per kernel) and
op_statistic.csv (totals per op type), plus each kernel's stall breakdown.

Column names follow msprof's where it has one; npusim's own columns come after.
Ratios are busy cycles of a pipe over the cycles its cores held the kernel's
blocks (msprof's aic_*_ratio / aiv_*_ratio): a pipe is *busy* while it works or
waits for its data. The stall breakdown splits each pipe's share of that
residency into work (its own cost: start-ups, bytes at its port rate,
compute), data (a data mover waiting for shared bandwidth or HBM beyond its
transfers' unloaded time; work + data = busy), flag (blocked on a
SetFlag/WaitFlag, barrier or cross-core flag) and idle (nothing to do), which
sum to 100%.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from attrs import frozen

from npusim.engine.device import KernelRecord
from npusim.engine.run import RunResult
from npusim.engine.stats import KernelStats
from npusim.graph.ir import Node
from npusim.ops.roofline import bound_of
from npusim.outputs import atomic_write

SUMMARY_COLUMNS = (
    "Op Name", "OP Type", "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
    "Block Dim", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "aicore_time(us)",
    "total_cycles", "aic_cube_ratio", "aic_mte1_ratio", "aic_mte2_ratio", "aic_fixpipe_ratio",
    "aic_scalar_ratio", "aiv_vec_ratio", "aiv_mte2_ratio", "aiv_mte3_ratio",
)
NPUSIM_COLUMNS = ("FLOPs", "GM Bytes", "HBM Bytes", "L2 Hit Rate", "Wasted Burst Bytes", "Bound", "Stream")
STATISTIC_COLUMNS = ("OP Type", "Core Type", "Count", "Total Time(us)", "Avg Time(us)", "Min Time(us)",
                     "Max Time(us)", "Ratio(%)")
_RATIOS = {"aic_cube_ratio": "AIC.M", "aic_mte1_ratio": "AIC.MTE1", "aic_mte2_ratio": "AIC.MTE2",
           "aic_fixpipe_ratio": "AIC.FIX", "aic_scalar_ratio": "AIC.S", "aiv_vec_ratio": "AIV.V",
           "aiv_mte2_ratio": "AIV.MTE2", "aiv_mte3_ratio": "AIV.MTE3"}
_TASK_TYPES = {"AIC": "AI_CORE", "AIV": "AI_VECTOR_CORE", "MIX": "MIX_AIC"}
STALLS = ("work", "data", "flag", "idle")
TABLE_FILES = ("op_summary.csv", "op_statistic.csv")  # what write_tables writes into its folder


@frozen
class Stall:
    """One pipe's share of its kernel's core residency, in % (sums to 100;
    work + data is the pipe's busy share, its utilisation)."""

    pipe: str  # "AIC.MTE2", ...
    work: float
    data: float
    flag: float
    idle: float

    @property
    def busy(self) -> float:
        return self.work + self.data


def stalls(stats: KernelStats) -> list[Stall]:
    out = []
    for pipe in sorted(set(stats.busy_cycles) | set(stats.wait_cycles)):
        total = stats.core_cycles.get(pipe.split(".")[0], 0)
        if not total:
            continue
        data = stats.data_wait_cycles.get(pipe, 0.0)
        work = stats.busy_cycles.get(pipe, 0.0) - data
        flag = stats.wait_cycles.get(pipe, 0.0)
        shares = [100 * work / total, 100 * data / total, 100 * flag / total]
        out.append(Stall(pipe, *shares, 100 - sum(shares)))
    return out


def _tensors(node: Node | None, graph, which: str) -> tuple[str, str, str]:
    """(shapes, dtypes, formats) as msprof lists them: ';' between tensors, ',' in a shape."""
    if node is None or graph is None:
        return "", "", ""
    specs = [graph.tensors[t] for t in (node.inputs if which == "in" else node.outputs).values()]
    return (";".join(",".join(map(str, s.shape)) for s in specs), ";".join(s.dtype.upper() for s in specs),
            ";".join(s.format for s in specs))


def summary_rows(result: RunResult, graph=None) -> list[dict]:
    """op_summary rows in start order; a kernel launched for a node of `graph` (its
    record's owner) lists that node's tensors. Task Wait Time: from the end of the
    previous task on the same stream (or the stream's first queueing) to this one's start."""
    hw = result.hw
    nodes = {n.name: n for n in graph.nodes} if graph is not None else {}
    rows, last_end = [], {}
    for k in sorted(result.kernels, key=lambda r: (r.start, r.id)):
        node = nodes.get(k.owner.node) if k.owner is not None else None
        s = k.stats
        shapes, dtypes, formats = _tensors(node, graph, "in")
        out_shapes = _tensors(node, graph, "out")[0]
        wait = k.start - last_end.get(k.stream, k.queued)
        last_end[k.stream] = k.end
        row = {
            "Op Name": k.name, "OP Type": k.op_type, "Task Type": _TASK_TYPES.get(k.core_type, k.core_type),
            "Task Start Time(us)": hw.us(k.start), "Task Duration(us)": hw.us(k.cycles),
            "Task Wait Time(us)": hw.us(max(wait, 0.0)), "Block Dim": k.block_dim, "Input Shapes": shapes,
            "Input Data Types": dtypes, "Input Formats": formats, "Output Shapes": out_shapes,
            "aicore_time(us)": hw.us(k.cycles), "total_cycles": k.cycles,
        }
        row |= {col: s.utilisation(pipe) for col, pipe in _RATIOS.items()}
        row |= {"FLOPs": s.flops, "GM Bytes": s.gm_bytes, "HBM Bytes": s.hbm_read_bytes + s.hbm_write_bytes,
                "L2 Hit Rate": s.l2_hit_rate, "Wasted Burst Bytes": s.wasted_burst_bytes, "Bound": bound_of(s, hw, k.cycles),
                "Stream": k.stream}
        row |= {f"{st.pipe} {what}(%)": getattr(st, what) for st in stalls(s) for what in STALLS}
        rows.append(row)
    return rows


def statistic_rows(result: RunResult) -> list[dict]:
    """op_statistic rows: per (op type, core type), largest total first."""
    hw = result.hw
    groups: dict[tuple[str, str], list[KernelRecord]] = {}
    for k in result.kernels:
        groups.setdefault((k.op_type, _TASK_TYPES.get(k.core_type, k.core_type)), []).append(k)
    total = sum(hw.us(k.cycles) for k in result.kernels) or 1.0
    rows = []
    for (op, core), ks in groups.items():
        times = [hw.us(k.cycles) for k in ks]
        rows.append({"OP Type": op, "Core Type": core, "Count": len(ks), "Total Time(us)": sum(times),
                     "Avg Time(us)": sum(times) / len(ks), "Min Time(us)": min(times), "Max Time(us)": max(times),
                     "Ratio(%)": 100 * sum(times) / total})
    return sorted(rows, key=lambda r: (-r["Total Time(us)"], r["OP Type"]))


def write_csv(rows: Sequence[dict], path: str | Path, columns: Iterable[str]) -> Path:
    """Rows under `columns` first, then any further keys they have, in first-seen order."""
    columns = list(columns)
    for r in rows:
        columns += [k for k in r if k not in columns]
    path = Path(path)
    with atomic_write(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def write_tables(result: RunResult, directory: str | Path, graph=None) -> tuple[Path, Path]:
    """op_summary.csv and op_statistic.csv into `directory` (created); `graph`: the
    graph the kernels were launched for (its tensors fill the shape columns)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return (write_csv(summary_rows(result, graph), d / TABLE_FILES[0], SUMMARY_COLUMNS + NPUSIM_COLUMNS),
            write_csv(statistic_rows(result), d / TABLE_FILES[1], STATISTIC_COLUMNS))


def statistic_table(result: RunResult, top: int = 10) -> str:
    """The hotspot table for the console."""
    rows = statistic_rows(result)
    width = max([len(r["OP Type"]) for r in rows[:top]] + [len("OP Type")]) + 2
    lines = [f"  {'OP Type':{width}s}{'Core Type':>16s}{'Count':>7s}{'Total(us)':>13s}{'Avg(us)':>11s}"
             f"{'Min(us)':>11s}{'Max(us)':>11s}{'Ratio(%)':>10s}"]
    for r in rows[:top]:
        lines.append(f"  {r['OP Type']:{width}s}{r['Core Type']:>16s}{r['Count']:>7d}{r['Total Time(us)']:>13,.1f}"
                     f"{r['Avg Time(us)']:>11,.2f}{r['Min Time(us)']:>11,.2f}{r['Max Time(us)']:>11,.2f}"
                     f"{r['Ratio(%)']:>10.1f}")
    if len(rows) > top:
        rest = rows[top:]
        kernels = sum(r["Count"] for r in rest)
        lines.append(f"  ... and {len(rest)} more ({kernels} kernel{'s' * (kernels != 1)}, "
                     f"{sum(r['Total Time(us)'] for r in rest):,.1f} us, {sum(r['Ratio(%)'] for r in rest):.1f}%)")
    return "\n".join(lines)


__all__ = ["NPUSIM_COLUMNS", "STALLS", "STATISTIC_COLUMNS", "SUMMARY_COLUMNS", "TABLE_FILES", "Stall", "stalls", "statistic_rows",
           "statistic_table", "summary_rows", "write_csv", "write_tables"]
